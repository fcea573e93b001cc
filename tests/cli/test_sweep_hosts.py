"""A sweep's points on the workers of other hosts (issue 70), started on loopback the way a cluster starts them: a
Prefect server of its own (`ragen server start`, no worker), then two process workers, each in its own working
folder (the project's checkout and a copy of it, named by ``RAGEN_PROJECT_DIR`` as on another machine) with its own
Prefect home, one flow run at a time, draining a three-point sweep into one shared lake. The worker running a point is
SIGKILLed with that point's process, as a lost host: the sweep marks the point crashed and ends; submitted again, it
runs only what is missing (the completed points return at once, the killed one resumes), and every point is in the
lake once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ragen_cli.local_server import PROJECT_DIR, _spawn, alive, base_env, start, stop, stop_process
from ragen_core.storage import DataLake, query
from tests.cli.test_server import POINT_OVERRIDES, RAGEN, _duplicates

pytestmark = pytest.mark.server

SWEEP = "hosts"
GRID = "algorithm.filter_ratio=[0.25,0.5,1.0]"  # one point each, then the survivor drains the third
POINTS = [f"{SWEEP}-p{i:03d}" for i in range(3)]
# what a worker's checkout needs to run the flows (the other host's copy of the project)
CHECKOUT = ("flows", "tasks", "ragen_core", "ragen_cli", "schemas", "configs", "examples", "prefect.yaml")
CHECKOUT += ("pyproject.toml",)


def _copy_checkout(target: Path) -> Path:
    for name in CHECKOUT:
        source = PROJECT_DIR / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target / name)
    return target


def _worker(env: dict[str, str], folder: Path, home: Path, log: Path) -> subprocess.Popen:
    """`prefect worker start --pool local-process --limit 1` of a host whose checkout is ``folder``."""
    home.mkdir(parents=True, exist_ok=True)
    own = {**env, "RAGEN_PROJECT_DIR": str(folder), "PREFECT_HOME": str(home)}
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "local-process", "--limit", "1"]
    return _spawn(command, own, log, cwd=folder)  # in its own session, as `ragen server start` starts its worker


def _sweep(env: dict[str, str], root: Path, model_dir: Path) -> list[str]:
    return [RAGEN, "sweep", "--config", "configs/bandit.yaml", "--grid", GRID, "--deployment", "--sweep-id", SWEEP,
            "--data-root", str(root), f"model.path={model_dir}", *POINT_OVERRIDES]  # fmt: skip


def _worker_of(pid: int, workers: dict[int, subprocess.Popen]) -> int | None:
    """The worker (its pid) that started the flow run process ``pid``."""
    try:
        return next((p.pid for p in psutil.Process(pid).parents() if p.pid in workers), None)
    except psutil.NoSuchProcess:
        return None


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """A server of its own, deployed, with no worker (the two hosts' workers are the test's)."""
    state_dir = tmp_path_factory.mktemp("hosts-server")
    state = start(port=0, state_dir=state_dir, worker=False, timeout=300)
    env = base_env(Path(state.home), state.api_url)
    env.pop("RAGEN_FAULT", None)
    yield state, env, state_dir
    stop(state_dir)
    assert not alive(state.server_pid)


def test_two_hosts_workers_drain_a_sweep_and_a_lost_host_s_point_resumes(hosts, tmp_path_factory, tiny_model_dir):
    state, env, state_dir = hosts
    root = tmp_path_factory.mktemp("hosts-lake")
    other = _copy_checkout(tmp_path_factory.mktemp("other-host"))
    workers: dict[int, subprocess.Popen] = {}
    for name, folder in (("a", PROJECT_DIR), ("b", other)):
        worker = _worker(env, folder, state_dir / f"home-{name}", state_dir / f"worker-{name}.log")
        workers[worker.pid] = worker
    try:
        sweep = subprocess.Popen(_sweep(env, root, tiny_model_dir), env=env, cwd=PROJECT_DIR, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        lake = DataLake(root)
        deadline = time.monotonic() + 600
        victim = None
        while victim is None:  # a point in the middle of its run: its worker and it go down together
            assert time.monotonic() < deadline and sweep.poll() is None, "no point was seen in the middle of its run"
            for run_id in POINTS:
                manifest = lake.read_manifest(run_id)
                committed = lake.committed_iterations(run_id)
                if manifest and manifest.status == "running" and committed and committed[-1] < 2:
                    owner = _worker_of(manifest.pid, workers)
                    if owner is not None:
                        victim = (run_id, manifest.pid, owner)
                        break
            time.sleep(0.2)
        run_id, flow_pid, owner = victim
        flow_group = os.getpgid(flow_pid)
        os.killpg(owner, signal.SIGKILL)  # the host is lost: its worker and the flow run it started
        os.killpg(flow_group, signal.SIGKILL)
        workers.pop(owner).wait()
        killed_at = lake.committed_iterations(run_id)
        output, _ = sweep.communicate(timeout=900)  # the survivor drains the rest; the sweep ends
        assert f"{run_id} lost its writer" in output, output[-3000:]
        assert lake.read_manifest(run_id).status == "running" and lake.committed_iterations(run_id) == killed_at
        done = [r for r in POINTS if r != run_id]
        assert all(lake.read_manifest(r).status == "completed" for r in done)
        # both hosts ran points, each from its own checkout (the copy is no git checkout: no commit recorded)
        assert {lake.read_manifest(r).git_commit is None for r in POINTS} == {True, False}
        markers = {r: [p.stat().st_mtime_ns for p in sorted((root / "_commits" / r).glob("*.json"))] for r in done}

        again = subprocess.run(_sweep(env, root, tiny_model_dir), env=env, cwd=PROJECT_DIR, text=True,
                               capture_output=True, timeout=900)  # fmt: skip
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        for r in done:  # nothing run again: their commits untouched
            assert [p.stat().st_mtime_ns for p in sorted((root / "_commits" / r).glob("*.json"))] == markers[r]
        manifest = lake.read_manifest(run_id)
        assert manifest.status == "completed" and len(manifest.resumes) == 1
        for r in POINTS:  # every point in the lake once, whole
            assert lake.committed_iterations(r) == [0, 1, 2, 3], r
            assert _duplicates(root, r) == {"trajectories": 0, "turns": 0, "metrics": 0, "evaluations": 0}, r
        rows = query(root, f"SELECT run_id, status FROM runs WHERE sweep_id = '{SWEEP}' ORDER BY run_id").to_pylist()
        assert rows == [{"run_id": r, "status": "completed"} for r in POINTS]
    finally:
        for pid in list(workers):
            stop_process(pid, signal.SIGINT)


def test_a_sweep_on_a_bucket_reaches_its_worker_as_the_bucket(hosts, s3_server, tmp_path, tiny_model_dir):
    """The data root in an object store (issue 71): the submitting host and the worker's host each keep their own
    local copy; a point's deployment run gets the bucket's URL (never the submitter's folder), trains in the
    worker's copy and commits to the bucket; the sweep's comparison sees what the worker committed; a third host
    reads both points through the Python API."""
    from ragen_core import api

    state, env, state_dir = hosts
    url = f"s3://{s3_server.bucket()}/lake"
    store_env = {**{k: v for k, v in env.items() if not k.startswith("AWS_")}, **s3_server.environment()}
    copies = {name: tmp_path / f"copies-{name}" for name in ("worker", "submitter", "reader")}
    worker_env = {**store_env, "RAGEN_OBJECT_CACHE": str(copies["worker"])}
    worker = _worker(worker_env, PROJECT_DIR, state_dir / "home-store", state_dir / "worker-store.log")
    points = ["bucket-p000", "bucket-p001"]
    command = [RAGEN, "sweep", "--config", "configs/bandit.yaml", "--grid", "algorithm.filter_ratio=[0.25,1.0]",
               "--deployment", "--sweep-id", "bucket", "--data-root", url, f"model.path={tiny_model_dir}",
               *POINT_OVERRIDES]  # fmt: skip
    try:
        done = subprocess.run(command, env={**store_env, "RAGEN_OBJECT_CACHE": str(copies["submitter"])},
                              cwd=PROJECT_DIR, text=True, capture_output=True, timeout=900)  # fmt: skip
    finally:
        stop_process(worker.pid, signal.SIGINT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("completed") >= 2 and "failed" not in done.stdout.lower(), done.stdout[-3000:]
    bucket = url.split("/")[2]
    keys = s3_server.objects(bucket)
    worker_copy, submitter_copy = (copies[name] / bucket / "lake" for name in ("worker", "submitter"))
    assert "lake/sweeps/bucket.json" in keys  # the plan, put by the submitter before its points ran
    for point in points:  # trained and committed by the worker, in its own copy; the submitter's holds the rows only
        assert [f"lake/_commits/{point}/iteration={i}.json" in keys for i in range(4)] == [True] * 4, point
        assert (worker_copy / "runs" / point / "checkpoints" / "iteration=3" / "checkpoint.json").is_file()
        assert not (submitter_copy / "runs" / point / "checkpoints").exists()
        assert (submitter_copy / "runs" / point / "manifest.json").is_file()
    reader = {**s3_server.environment(), "RAGEN_OBJECT_CACHE": str(copies["reader"])}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in reader.items():
            patch.setenv(name, value)
        rows = api.query("SELECT run_id, status FROM runs WHERE sweep_id = 'bucket' ORDER BY run_id", data_root=url)
    assert rows.to_pylist() == [{"run_id": p, "status": "completed"} for p in points]
