"""The vLLM environment for the tests that need a real vLLM server (`make install-vllm` builds it)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from ragen_core.rollout.vllm_local import BackendUnavailable, vllm_python

REQUIRED = "RAGEN_REQUIRE_VLLM"  # set by CI: a missing vLLM environment fails these tests instead of skipping them


def require_vllm_python() -> Path:
    """The vLLM environment's Python; skips the test without it (fails it when ``RAGEN_REQUIRE_VLLM=1``)."""
    try:
        return vllm_python()
    except BackendUnavailable as exc:
        if os.environ.get(REQUIRED) == "1":
            pytest.fail(f"{REQUIRED}=1 but {exc}")
        pytest.skip(f"no vLLM environment: `make install-vllm` builds it ({exc})")


def server_processes(marker: str) -> list[int]:
    """Pids of live vLLM rollout servers whose command line mentions ``marker`` (a folder of the test's)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        command = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(part.endswith("vllm_server.py") for part in command) and any(marker in part for part in command):
            found.append(process.info["pid"])
    return found


def session_servers(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of live vLLM rollout servers started under the test session marked ``mark``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        command = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE or not any(p.endswith("vllm_server.py") for p in command):
            continue
        try:
            if process.environ().get("RAGEN_TEST_SESSION") == mark:
                found.append((process.info["pid"], " ".join(command)))
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found


CLUSTER = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"
TOKEN = "test-rollout-token-0123456789"


def documented_servers() -> tuple[list[str], list[str]]:
    """docs/cluster.md's two commands of "Rollout servers on other hosts": (``rollout serve`` args, ``train`` args),
    without "ragen" (the test fills in the model, the port and 127.0.0.1)."""
    section = CLUSTER.read_text().split("## Rollout servers on other hosts", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    lines = [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("ragen ")]
    assert [line[0] for line in lines] == ["rollout", "train"], lines
    return lines[0], lines[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class OtherHost:
    """docs/cluster.md's `ragen rollout serve` as another host runs it: its own session and working folder."""

    def __init__(self, folder: Path, model_dir: Path, port: int) -> None:
        self.folder, self.model_dir, self.port = folder, model_dir, port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> OtherHost:
        self.folder.mkdir(parents=True, exist_ok=True)
        args, _ = documented_servers()
        args = [str(self.model_dir) if a == "/shared/models/Qwen2.5-0.5B-Instruct" else a for a in args]
        args = ["127.0.0.1" if a == "0.0.0.0" else str(self.port) if a == "8000" else a for a in args]
        env = {**os.environ, "RAGEN_ROLLOUT_TOKEN": TOKEN}
        log = open(self.folder / "serve.log", "ab")  # noqa: SIM115 - the server's, kept open while it runs
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("ragen")), *args, "--enforce-eager"],
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 300
        while self.health().get("state") != "ready":
            assert self.process.poll() is None, (self.folder / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the rollout server was not ready in 300 s"
            time.sleep(0.5)
        return self

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                return json.loads(answer.read())
        except OSError:
            return {}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
