"""A real S3-compatible server for the object-store tests: moto's server mode (``moto_server``, from the package
registries; chosen because it is pure Python, installs with pip beside the project, implements the conditional puts
the lake relies on (``If-None-Match: *``, ``If-Match``) and starts in a second on 127.0.0.1). Each test gets a
bucket of its own; the server runs in its own session and is stopped by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from tests.vllm_env import free_port

# what the tests' processes use: endpoint and credentials from the standard AWS variables only
KEY_ID = "AKIARAGENTESTKEY0042"
SECRET = "ragen-test-secret-0d9f8e7c6b5a"


class S3Server:
    """``moto_server -H 127.0.0.1 -p PORT``, as a user starts it."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> S3Server:
        program = Path(sys.executable).with_name("moto_server")
        log = open(self.folder / "moto.log", "wb")  # noqa: SIM115 - the server's, closed with it
        self.process = subprocess.Popen(
            [str(program), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2).read()
                return self
            except OSError:
                if self.process.poll() is not None:
                    log = (self.folder / "moto.log").read_text()[-2000:]
                    raise RuntimeError(f"moto_server exited: {log}") from None
                time.sleep(0.2)
        raise RuntimeError("moto_server did not answer within 60 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)

    def environment(self) -> dict[str, str]:
        """The variables a process on a host with access to this store has (and nothing else of AWS's)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",  # never look for an instance's role
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def bucket(self) -> str:
        """A new, empty bucket."""
        import boto3

        name = f"lake-{uuid.uuid4().hex[:12]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)
        return name

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of ``bucket``: key -> bytes."""
        client = self.client()
        keys = [
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])
        ]
        return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}
