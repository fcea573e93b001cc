"""The generated tool tasks' configs trained end to end, each through another of the doors users take (tiny sizes: a
four-demonstration bootstrap, one StarPO-S iteration): `configs/sql_agent.yaml` as a run of the `train` deployment
on the session's Prefect server and process worker (with LoRA adapters, `actor.lora.rank=4`, on the bootstrap's
model), `configs/search_qa.yaml` through the Python API
(`ragen_core.train`); `configs/calculator.yaml` goes through `ragen train` in tests/flows/test_calculator_flow.py.
Each run's tool calls are rows of the lake: the bootstrap's demonstrations call the task's own tools, and every
turn of the trained run keeps its calls."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ragen_cli.local_server import alive, start_worker, stop_process
from ragen_core.storage import DataLake, query

FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
SERVER = [pytest.mark.server, pytest.mark.process]  # the session's `ragen server` and its worker's flow run


def _tiny(model_dir) -> list[str]:
    return [
        f"model.path={model_dir}",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=1",
        "eval.every=1",
        "eval.instances=2",
        "bootstrap.num_groups=4",
        "bootstrap.epochs=1",
        "bootstrap.batch_size=4",
        "trainer.num_threads=1",
    ]


def _deployed(api_url: str, parameters: dict) -> str:
    """A run of the ``train`` deployment on the session's worker, waited for (up to 400 s): its final state."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        flow_run = run_deployment("train/train", parameters=parameters, timeout=0)
        deadline = time.monotonic() + 400
        while (state := client.read_flow_run(flow_run.id).state.type.value) not in FINAL:
            assert time.monotonic() < deadline, f"the deployment run did not finish: {state}"
            time.sleep(1)
    return state


@pytest.fixture(scope="module")
def sql_root(prefect_server, tmp_path_factory, tiny_model_dir) -> Path:
    state, env, state_dir = prefect_server
    worker = None
    if not (state.worker_pid and alive(state.worker_pid)):  # the session's worker, unless a test elsewhere killed it
        worker = start_worker(env, state_dir / "worker-tool-tasks.log").pid
    root = tmp_path_factory.mktemp("sql-agent")
    parameters = {
        "config": "configs/sql_agent.yaml",
        "data_root": str(root),
        "run_id": "sql",
        "overrides": [*_tiny(tiny_model_dir), "actor.lora.rank=4"],  # LoRA through a deployment, on the bootstrap
    }
    try:
        assert _deployed(state.api_url, parameters) == "COMPLETED"
    finally:
        if worker is not None:
            stop_process(worker, signal.SIGINT)
    assert DataLake(root).read_manifest("sql").pid != os.getpid()  # run by the worker, not here
    formats = query(root, "SELECT DISTINCT format FROM checkpoints WHERE run_id = 'sql' ORDER BY 1")["format"]
    assert formats.to_pylist() == ["deepspeed", "lora"]  # the RL stage trained adapters on the bootstrap's model
    return root


@pytest.fixture(scope="module")
def search_root(tmp_path_factory, tiny_model_dir) -> Path:
    import ragen_core

    root = tmp_path_factory.mktemp("search-qa")
    result = ragen_core.train("configs/search_qa.yaml", root, "search", _tiny(tiny_model_dir))
    assert result.status == "completed"
    return root


def _calls(root: Path, kind: str) -> list[dict]:
    return query(
        root,
        "SELECT c.name, c.error, c.result FROM turns t JOIN runs USING (run_id), UNNEST(t.tool_calls) AS u(c) "
        f"WHERE kind = '{kind}' ORDER BY ALL",
    ).to_pylist()


@pytest.mark.parametrize(
    ("which", "run", "tools", "looks_up", "env"),
    [
        # the sql run is a deployment run on the session's server: marked so, since request brings its root
        pytest.param(
            "sql_root", "sql", {"list_tables", "describe", "query", "answer"}, "query", "sql_agent", marks=SERVER
        ),
        ("search_root", "search", {"search", "answer"}, "search", "search_qa"),
    ],
)
def test_the_config_trains_through_a_bootstrap_then_starpo_s_with_its_tools(request, which, run, tools, looks_up, env):
    root = request.getfixturevalue(which)
    runs = query(root, "SELECT kind, status FROM runs ORDER BY kind").to_pylist()
    assert [(r["kind"], r["status"]) for r in runs] == [("bootstrap", "completed"), ("train", "completed")]
    assert DataLake(root).read_manifest(run).config["env"]["name"] == env
    demonstrated = _calls(root, "bootstrap")
    called = {c["name"] for c in demonstrated}
    assert looks_up in called and called <= tools  # the teacher's look-up among them, no name of another task
    kept = query(
        root,
        "SELECT split, bool_and(tool_calls IS NOT NULL) AS kept, count(*) AS n FROM turns JOIN runs USING (run_id) "
        "WHERE kind = 'train' GROUP BY split ORDER BY split",
    ).to_pylist()
    assert [r["split"] for r in kept] == ["train", "val"] and all(r["kept"] for r in kept)
