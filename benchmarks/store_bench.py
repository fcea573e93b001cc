"""A data root in an object store against a local folder: the demo's iterations and `ragen sql`'s query time.

    python -m benchmarks.store_bench [--repeats 3] [--iterations 3]

Iterations: the demo config (configs/bandit.yaml, ``trainer.iterations`` shortened) trained by the same command on a
local folder and on ``s3://<bucket>/lake`` of a local S3-compatible server (moto's server mode, the tests' own),
interleaved whole runs; seconds per iteration on each side (the median time between the run's consecutive commits:
an iteration with its commit, on a bucket its changeset's uploads, commit and copies), ``store_over_local`` their
ratio per repeat; and the whole run's seconds (with its start, the bucket's opening and the bootstrap). Query:
`ragen sql` (the command, a process each time) on the finished run's root, locally, on the bucket with a local copy
that is empty (``cold``: everything the tables need downloaded first) and with one that is up to date (``warm``: a
listing, nothing to download).

The server runs on this machine, so the figures are what the protocol costs (requests, copies, the changeset's
uploads and server-side copies), not a network's latency or bandwidth: a bucket across a network adds its round trip
to each request of a commit (three per changed file, sent eight at a time: its upload, its copy, the upload's
deletion; and about seven per commit: the lease read back twice, the changeset, the commit, two listings, the
changeset's deletion).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import interleave, spread

KEY_ID, SECRET = "AKIABENCHKEY00000001", "bench-secret-value-0001"
QUERY = "SELECT iteration, split, count(*) AS n, avg(total_reward) AS reward FROM trajectories GROUP BY ALL"


class LocalS3:
    """``moto_server -H 127.0.0.1 -p PORT`` in its own session, stopped by its PID."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        program = Path(sys.executable).with_name("moto_server")
        self.process = subprocess.Popen(
            [str(program), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def bucket(self) -> str:
        import boto3

        name = f"bench-{uuid.uuid4().hex[:10]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)


def _ragen(args: list[str], env: dict[str, str]) -> float:
    """Seconds the installed CLI took (it must succeed)."""
    started = time.perf_counter()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("ragen")), *args], capture_output=True, text=True, env=env, timeout=3600
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"ragen {' '.join(args[:2])} failed: {result.stderr[-2000:]}")
    return seconds


def _iteration_seconds(root: Path, run_id: str) -> float:
    """The median time between the run's consecutive commits (each written once its iteration, and on a bucket its
    changeset's commit, are done): an iteration's wall time, whole, without the run's start."""
    from ragen_core.storage.layout import commits_dir

    markers = sorted((int(p.stem.split("=")[1]), p.stat().st_mtime) for p in commits_dir(root, run_id).glob("*.json"))
    gaps = [later - earlier for (_, earlier), (_, later) in zip(markers, markers[1:], strict=False)]
    return spread(gaps)["median"]


def run(repeats: int, iterations: int, threads: int, work: Path) -> dict[str, Any]:
    """Interleaved demo runs on a local folder and on the local S3 server, then `ragen sql` on both."""
    server = LocalS3()
    try:
        env = {**os.environ, **server.environment(), "RAGEN_OBJECT_CACHE": str(work / "cache")}
        overrides = [f"trainer.iterations={iterations}", f"trainer.num_threads={threads}"]
        train = ["train", "--config", "configs/bandit.yaml", *overrides]
        roots: dict[str, list[str]] = {"local": [], "store": []}

        def side(name: str) -> float:
            run_id = f"bench-{uuid.uuid4().hex[:8]}"
            bucket = server.bucket()
            root = str(work / f"local-{run_id}") if name == "local" else f"s3://{bucket}/lake"
            roots[name].append(root)
            _ragen([*train, "--run-id", run_id, "--data-root", root], env)
            folder = Path(root) if name == "local" else work / "cache" / bucket / "lake"
            return _iteration_seconds(folder, run_id)

        timed = interleave({"local": lambda: side("local"), "store": lambda: side("store")}, repeats)
        whole = {name: [seconds for seconds, _ in rows] for name, rows in timed.items()}
        per_iteration = {name: [result for _, result in rows] for name, rows in timed.items()}
        ratios = [s / loc for s, loc in zip(per_iteration["store"], per_iteration["local"], strict=True)]
        query = {"local": [], "store_cold": [], "store_warm": []}
        for number in range(repeats):
            cold = {**env, "RAGEN_OBJECT_CACHE": str(work / f"reader-{number}")}
            query["local"].append(_ragen(["sql", QUERY, "--data-root", roots["local"][0]], env))
            query["store_cold"].append(_ragen(["sql", QUERY, "--data-root", roots["store"][0]], cold))
            query["store_warm"].append(_ragen(["sql", QUERY, "--data-root", roots["store"][0]], cold))
        return {
            "iterations": iterations,
            "repeats": repeats,
            "seconds_per_iteration": {name: spread(values) for name, values in per_iteration.items()},
            "run_seconds": {name: spread(values) for name, values in whole.items()},
            "run_over_local": spread([s / loc for s, loc in zip(whole["store"], whole["local"], strict=True)]),
            "store_over_local": spread(ratios),
            "sql_seconds": {name: spread(values) for name, values in query.items()},
            "sql_warm_over_local": spread(
                [warm / local for warm, local in zip(query["store_warm"], query["local"], strict=True)]
            ),
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="store-bench-"))
    try:
        print(json.dumps(run(args.repeats, args.iterations, args.threads, work), indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
