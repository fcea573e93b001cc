"""Sweeps through deployments on a real Prefect server and process worker, started the way users start them
(`ragen server start`: server on a free loopback port, the work pool, `prefect deploy --all`, a worker), then a
worker killed in the middle of a sweep point and the flow run retried; everything stopped by PID at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from ragen_cli.local_server import PROJECT_DIR, alive, start_worker, stop_process
from ragen_core.storage import DataLake, query

pytestmark = pytest.mark.server

POINT_OVERRIDES = [
    "rollout.env_groups=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size=4",
    "trainer.iterations=3",
    "eval.every=1",
    "eval.instances=2",
    "env.val_envs=[bandit]",
    "bootstrap.enabled=false",
    "trainer.num_threads=1",  # tests: no second thread spinning against the other processes on 2 cores
]
RAGEN = str(Path(sys.executable).with_name("ragen"))


@pytest.fixture(scope="module")
def server(prefect_server):
    """The session's real server and worker; ``workers`` holds the PIDs of workers a test starts itself (stopped
    here), ``reference`` the lake of the first sweep (the kill test compares with it)."""
    state, env, state_dir = prefect_server
    shared = SimpleNamespace(state=state, env=env, state_dir=state_dir, workers=[], reference=None)
    yield shared
    for pid in shared.workers:
        stop_process(pid, signal.SIGINT)
        assert not alive(pid)


def _sweep_command(root: Path, model_dir: Path, sweep_id: str, grid: str) -> list[str]:
    return [
        RAGEN,
        "sweep",
        "--config",
        "configs/bandit.yaml",
        "--grid",
        grid,
        "--deployment",
        "--sweep-id",
        sweep_id,
        "--data-root",
        str(root),
        f"model.path={model_dir}",
        *POINT_OVERRIDES,
    ]


@contextmanager
def _client(server) -> Iterator:
    """Prefect's client on the session's server, in this process (as tests/flows/test_prefect_ui.py reads it): the
    server's address set for the block only, over whatever Prefect settings (a test harness) this process holds. A
    process of its own per read cost ~3 s of imports each, ~10 of them here (the kill test polled through them)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server.state.api_url}), get_client(sync_client=True) as client:
        yield client


def _flow_run_state(server, name: str) -> list[list[str]]:
    """[flow run id, state type] of each flow run named ``name``."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with _client(server) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return [[str(r.id), r.state.type.value] for r in runs]


def _rows(root: Path, run_id: str, table: str) -> list[dict]:
    return query(root, f"SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = '{run_id}' ORDER BY ALL").to_pylist()


def _duplicates(root: Path, run_id: str) -> dict[str, int]:
    keys = {
        "trajectories": "iteration, split, env, group_id, traj_index",
        "turns": "iteration, split, env, group_id, traj_index, turn_index",
        "metrics": "iteration, name",
        "evaluations": "iteration, env",
    }
    return {
        table: query(
            root, f"SELECT count(*) - count(DISTINCT ({key})) AS d FROM {table} WHERE run_id = '{run_id}'"
        ).to_pylist()[0]["d"]
        for table, key in keys.items()
    }


def test_prefect_yaml_deploys_the_four_flows_with_the_pool_pull_step_and_schedule(server):
    with _client(server) as client:
        deployments = {}
        for d in client.read_deployments():
            deployments[f"{client.read_flow(d.flow_id).name}/{d.name}"] = {
                "pool": d.work_pool_name,
                "pull": d.pull_steps,
                "entrypoint": d.entrypoint,
                "schedules": [{"active": s.active, "parameters": s.parameters} for s in d.schedules],
            }
    deployments = json.loads(json.dumps(deployments))  # plain data, as the server sent it
    assert set(deployments) == {"train/train", "sweep/sweep", "evaluate/evaluate", "retrain_offline/retrain-offline"}
    for name, info in deployments.items():
        assert info["pool"] == "local-process", name
        assert info["pull"] == [{"ragen_cli.deploy_steps.set_project_directory": {"default": str(PROJECT_DIR)}}]
    assert deployments["train/train"]["entrypoint"] == "flows/train.py:train"
    [schedule] = deployments["sweep/sweep"]["schedules"]
    assert schedule["active"] is False and schedule["parameters"]["deployment"] == "train/train"
    grid = ['algorithm.filter=["std","std_rev"]', "algorithm.filter_ratio=[0.25,0.5]"]
    assert schedule["parameters"]["grid"] == grid


def test_a_two_point_sweep_runs_as_deployment_runs(server, tmp_path_factory, tiny_model_dir):
    env = server.env
    root = tmp_path_factory.mktemp("server-lake")
    done = subprocess.run(
        _sweep_command(root, tiny_model_dir, "srv", "algorithm.filter_ratio=[0.5,1.0]"),
        env=env,
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "sweep comparison" in done.stdout
    rows = query(
        root,
        """
        SELECT t.run_id, r.sweep_id, r.sweep_point, r.overrides_json, r.status, count(*) AS trajectories
        FROM trajectories t JOIN runs r USING (run_id) GROUP BY ALL ORDER BY ALL
    """,
    ).to_pylist()
    assert rows == [
        {
            "run_id": "srv-p000",
            "sweep_id": "srv",
            "sweep_point": 0,
            "overrides_json": '["algorithm.filter_ratio=0.5"]',
            "status": "completed",
            "trajectories": 3 * 4 + 4 * 2,
        },
        {
            "run_id": "srv-p001",
            "sweep_id": "srv",
            "sweep_point": 1,
            "overrides_json": '["algorithm.filter_ratio=1.0"]',
            "status": "completed",
            "trajectories": 3 * 4 + 4 * 2,
        },
    ]
    for run_id in ("srv-p000", "srv-p001"):  # each point ran as a flow run of the train deployment, on the worker
        assert [state for _, state in _flow_run_state(server, run_id)] == ["COMPLETED"]
        manifest = DataLake(root).read_manifest(run_id)
        assert manifest.pid != os.getpid() and "prefect" in " ".join(manifest.command)
    server.reference = root  # the kill test compares with srv-p000


def test_a_killed_worker_and_a_retried_flow_run_complete_the_point_without_duplicates(server, tiny_model_dir):
    state, env, root = server.state, server.env, server.reference
    if root is None:
        pytest.skip("needs the sweep of the previous test as its reference")
    # the same point config as srv-p000, under another sweep id
    sweep = subprocess.Popen(
        _sweep_command(root, tiny_model_dir, "kill", "algorithm.filter_ratio=[0.5]"),
        env=env,
        cwd=PROJECT_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lake, run_id = DataLake(root), "kill-p000"
    deadline = time.monotonic() + 600
    while 1 not in lake.committed_iterations(run_id):
        assert time.monotonic() < deadline and sweep.poll() is None, "the point never committed iteration 1"
        time.sleep(0.2)
    flow_pid = lake.read_manifest(run_id).pid
    flow_group = os.getpgid(flow_pid)
    assert flow_group not in (os.getpgid(0), state.server_pid)
    os.killpg(state.worker_pid, signal.SIGKILL)  # the worker and, like a lost machine, the flow run it started
    os.killpg(flow_group, signal.SIGKILL)
    time.sleep(1)
    assert not alive(flow_pid)
    committed_at_kill = lake.committed_iterations(run_id)
    assert committed_at_kill[-1] < 3, "the point finished before the kill; the test would prove nothing"
    sweep.wait(timeout=120)  # the sweep sees that the point lost its writer, marks it crashed and ends
    [(flow_run_id, state_type)] = _flow_run_state(server, run_id)
    assert state_type == "CRASHED"  # nobody else would have told the server: a crashed worker leaves it RUNNING
    retry = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", flow_run_id],
        env=env,
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr
    server.workers.append(start_worker(env, server.state_dir / "worker-2.log").pid)
    while [s for _, s in _flow_run_state(server, run_id)] != ["COMPLETED"]:
        assert time.monotonic() < deadline, f"the retried flow run did not complete: {_flow_run_state(server, run_id)}"
        time.sleep(1)

    manifest = lake.read_manifest(run_id)
    assert manifest.status == "completed" and len(manifest.resumes) == 1
    assert lake.committed_iterations(run_id) == [0, 1, 2, 3]
    assert _duplicates(root, run_id) == {"trajectories": 0, "turns": 0, "metrics": 0, "evaluations": 0}
    # and the resumed point holds exactly the rows of the uninterrupted run of the same config
    for table in ("trajectories", "turns", "evaluations"):
        assert _rows(root, run_id, table) == _rows(root, "srv-p000", table), table
    assert _learning_metrics(root, run_id) == _learning_metrics(root, "srv-p000")


def _learning_metrics(root: Path, run_id: str) -> list[dict]:
    """The metrics rows without wall-clock figures (``time/*``, ``perf/*``), which differ between any two runs."""
    sql = f"SELECT iteration, name, value FROM metrics WHERE run_id = '{run_id}'"
    sql += " AND split_part(name, '/', 1) NOT IN ('time', 'perf')"
    sql += " ORDER BY ALL"
    return query(root, sql).to_pylist()
