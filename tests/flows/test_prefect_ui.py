"""What a run shows in Prefect's UI, read back from a real Prefect server (the session's `ragen server start`, with its
deployments and process worker) through Prefect's client: flow runs named after their run ids and tagged (env,
preset, sweep), task runs named with their iteration, the iteration summaries and the early warnings in the run's
logs (while the terminal shows each line once, as before), the run's UI address printed by the command,
deployments whose parameter schemas hold no internal parameter, an async run's lanes side by side, and one bad input
refused with one message by the command, the API and a deployment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ragen_core
from ragen_cli.local_server import PROJECT_DIR, alive, start_worker, stop_process
from ragen_core.run.requests import refusals
from ragen_core.storage import DataLake, query
from tests.flows.test_async import async_overrides

pytestmark = pytest.mark.server

RAGEN = str(Path(sys.executable).with_name("ragen"))
TINY = [
    "trainer.iterations=1",
    "bootstrap.enabled=false",
    "rollout.env_groups=2",
    "rollout.group_size=1",  # a group of one has no reward spread: with the next line the filter keeps no group
    "algorithm.filter_include_zero=false",  # ... which the run warns about (ragen.monitor), every time
    "rollout.max_new_tokens=6",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size=2",
    "eval.every=1",
    "eval.instances=2",
    "env.val_envs=[bandit]",
    "trainer.num_threads=1",
]
WARNING = "the filter kept no group; the update is skipped"
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@pytest.fixture(scope="module")
def server(prefect_server, tmp_path_factory, tiny_model_dir):
    """The session's server; a worker of our own when the session's is gone (a test elsewhere kills it)."""
    state, env, state_dir = prefect_server
    worker = None
    if not (state.worker_pid and alive(state.worker_pid)):
        worker = start_worker(env, state_dir / "worker-ui.log").pid
    root = tmp_path_factory.mktemp("ui-lake")
    yield SimpleNamespace(api_url=state.api_url, env=env, root=root, model=f"model.path={tiny_model_dir}")
    if worker is not None:
        stop_process(worker, signal.SIGINT)


def _ragen(server, args: list[str], configured: bool = True) -> subprocess.CompletedProcess:
    """The installed command, talking to the session's server (``configured``) or to its own temporary one."""
    env = dict(server.env)
    if not configured:
        env = {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    done = subprocess.run(
        [RAGEN, *args, "--data-root", str(server.root)],
        env=env,
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@contextmanager
def _client(server) -> Iterator:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as client:
        yield client


def _seen(server, name: str) -> dict:
    """The flow run named ``name`` (exactly one) as the UI shows it: tags, state, task run names, logs."""
    from prefect.client.schemas import filters as f

    with _client(server) as client:
        runs = client.read_flow_runs(flow_run_filter=f.FlowRunFilter(name=f.FlowRunFilterName(any_=[name])))
        assert len(runs) == 1, [r.name for r in runs]
        run = runs[0]
        by_run = f.TaskRunFilter(flow_run_id=f.TaskRunFilterFlowRunId(any_=[run.id]))
        tasks = client.read_task_runs(task_run_filter=by_run)
        logs = client.read_logs(log_filter=f.LogFilter(flow_run_id=f.LogFilterFlowRunId(any_=[run.id])))
    return {
        "id": str(run.id),
        "tags": set(run.tags),
        "state": run.state.type.value,
        "tasks": {t.name for t in tasks},
        "logs": [(log.name, log.level, log.message) for log in logs],
        "parent": run.parent_task_run_id,
    }


def test_a_command_line_run_is_named_tagged_and_logged_and_prints_its_address(server):
    done = _ragen(server, ["train", "--config", "configs/bandit.yaml", "--run-id", "ui-run", server.model, *TINY])
    seen = _seen(server, "ui-run")
    assert seen["state"] == "COMPLETED"
    assert seen["tags"] == {"env:bandit", "preset:starpo_s"}
    stages = {"generate", "persist", "validate", "filter", "update", "evaluate", "commit", "artifact"}
    assert {f"{stage}-i0" for stage in stages} | {"evaluate-i1", "commit-i1", "artifact-i1"} <= seen["tasks"]
    # the summary lines, as the terminal shows them, and the early warning, from inside the filter's task run
    summaries = [m for name, _, m in seen["logs"] if name == "ragen.run"]
    printed = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("iter ")]
    assert summaries == printed and [s.split(" · ")[0] for s in summaries] == ["iter   0", "iter   1"]
    assert ("ragen.monitor", 30, f"run ui-run iteration 0: {WARNING}") in seen["logs"]
    assert ("prefect.flow_runs", 20, "Finished in state Completed()") in seen["logs"]
    # not buried under a line per task run (about 22 an iteration): Prefect's task-run lines are its warnings only
    assert [m for name, level, m in seen["logs"] if name == "prefect.task_runs" and level < 30] == []
    # the terminal as before: each line once, Prefect's own info lines not at all; and the run's address
    output = done.stdout + done.stderr
    assert output.count(WARNING) == 1 and done.stdout.count("iter   0 ·") == 1
    assert "Finished in state" not in output and "Beginning flow run" not in output
    base = server.api_url.removesuffix("/api")
    assert re.findall(r"^Prefect UI: (\S+)$", done.stdout, re.M) == [f"{base}/runs/flow-run/{seen['id']}"]


def test_an_evaluation_is_named_after_its_run_id(server):
    if DataLake(server.root).read_manifest("ui-run") is None:
        pytest.skip("needs the run of the previous test")
    done = _ragen(server, ["eval", "ui-run", "--run-id", "ui-eval", "--n", "2"])
    seen = _seen(server, "ui-eval")
    assert seen["state"] == "COMPLETED" and seen["tags"] == {"env:bandit", "preset:starpo_s", "evaluation"}
    assert "evaluate-i0" in seen["tasks"] and "commit-i0" in seen["tasks"]
    lines = [m for name, _, m in seen["logs"] if name == "ragen.run"]
    assert [m.split(" · ")[0] for m in lines if m.startswith("iter ")] == ["iter   0"]
    assert "validating on bandit: 2 instances" in lines  # what it does as it goes, in the UI too
    assert "Prefect UI: " in done.stdout
    # with the command's own temporary server (no UI, gone when the command ends) no address is printed
    quiet = _ragen(server, ["eval", "ui-run", "--run-id", "ui-eval-2", "--n", "2"], configured=False)
    assert "Prefect UI" not in quiet.stdout + quiet.stderr and "evaluation run" in quiet.stdout


def test_a_sweep_and_its_points_are_named_after_their_ids_and_tagged_with_the_sweep(server):
    done = _ragen(
        server,
        [
            "sweep",
            "--config",
            "configs/bandit.yaml",
            "--grid",
            "seed=[5]",
            "--sweep-id",
            "ui-sweep",
            server.model,
            *TINY,
        ],
    )
    # a line as each point starts and ends (and the same lines in the sweep's logs on the server)
    assert "point 1 of 1: ui-sweep-p000 · seed=5\n" in done.stdout
    assert re.search(r"point 1 of 1: ui-sweep-p000 completed in \d+ s\n", done.stdout), done.stdout
    sweep, point = _seen(server, "ui-sweep"), _seen(server, "ui-sweep-p000")
    assert sweep["tags"] == point["tags"] == {"env:bandit", "preset:starpo_s", "sweep:ui-sweep"}
    assert sweep["parent"] is None and point["parent"] is not None  # the point ran as a subflow of the sweep
    assert "generate-i0" in point["tasks"] and point["state"] == sweep["state"] == "COMPLETED"
    steps = [m for name, _, m in sweep["logs"] if name == "ragen.run"]
    assert steps[0] == "point 1 of 1: ui-sweep-p000 · seed=5"
    assert steps[1].startswith("point 1 of 1: ui-sweep-p000 completed in ")


def test_deployments_expose_no_internal_parameter(server):
    with _client(server) as client:
        schemas = {
            name: set(client.read_deployment_by_name(name).parameter_openapi_schema["properties"])
            for name in ("train/train", "retrain_offline/retrain-offline", "sweep/sweep", "evaluate/evaluate")
        }
    assert schemas["train/train"] == {
        "config",
        "data_root",
        "run_id",
        "force_config",
        "skip_iteration",
        "overrides",
        "sweep",
    }
    assert schemas["retrain_offline/retrain-offline"] == {
        "config",
        "sql",
        "mode",
        "init",
        "data_root",
        "run_id",
        "overrides",
    }
    assert not any("progress" in names for names in schemas.values())


def _run_deployment(server, parameters: dict):
    """A run of the ``train`` deployment on the session's worker, waited for (up to 400 s) until it ends."""
    from prefect.deployments import run_deployment

    with _client(server) as client:
        flow_run = run_deployment("train/train", parameters=parameters, timeout=0)
        deadline = time.monotonic() + 400
        while (state := client.read_flow_run(flow_run.id).state.type.value) not in FINAL:
            assert time.monotonic() < deadline, f"the deployment run did not finish: {state}"
            time.sleep(1)
    return flow_run


# One run of the ``train`` deployment on the process worker, read by the next two tests: an async run (two batches
# ahead) started without a run id, so the flow derives its id (one deployment run where two proved the same: the
# naming and tagging, and the lanes side by side).
DEPLOYED_ITERATIONS = 4
# The async runs below (the deployment's and the command's): the sampler lane's first task run starts in its own thread
# as the update starts in the run's, and on 2 busy cores that start can lag by a tenth of a second, as long as the tiny
# model's one-pass update: sixteen passes make the update several times longer, so the overlap tests see the overlap
# the schedule makes, not the host's scheduling.
LONG_UPDATE = ["actor.ppo_epochs=16"]


@pytest.fixture(scope="module")
def deployed(server, tmp_path_factory, tiny_model_dir):
    """The deployment run (waited for) and its data root."""
    root = tmp_path_factory.mktemp("ui-deployed")
    overrides = [*async_overrides(tiny_model_dir, 2, DEPLOYED_ITERATIONS, eval_every=10), *LONG_UPDATE]
    parameters = {"config": "configs/bandit.yaml", "data_root": str(root), "overrides": overrides}
    return SimpleNamespace(flow_run=_run_deployment(server, parameters), root=root)


def test_a_deployment_run_without_a_run_id_is_renamed_to_the_id_it_derives_and_tagged(server, deployed):
    flow_run, root = deployed.flow_run, deployed.root
    [run_id] = [row["run_id"] for row in query(root, "SELECT run_id FROM runs").to_pylist()]
    assert run_id.startswith("bandit-") and run_id != flow_run.name  # derived by the flow, not Prefect's random name
    seen = _seen(server, run_id)
    # a summary line per iteration, and one for the validation after the last update
    summaries = [f"iter {i:>3}" for i in range(DEPLOYED_ITERATIONS + 1)]
    # the worker's flow-run process sends its logs in batches, the last ones as it exits, which can be after the run
    # is COMPLETED: wait (up to a minute) for the summary lines before reading the logs
    deadline = time.monotonic() + 60
    while sum(name == "ragen.run" for name, _, _ in seen["logs"]) < len(summaries) and time.monotonic() < deadline:
        time.sleep(1)
        seen = _seen(server, run_id)
    assert seen["id"] == str(flow_run.id) and seen["state"] == "COMPLETED"
    assert seen["tags"] == {"ragen", "env:bandit", "preset:starpo_s"}
    assert {"generate-i0", "update-i0", "commit-i1"} <= seen["tasks"]
    assert [m.split(" · ")[0] for name, _, m in seen["logs"] if name == "ragen.run"] == summaries
    assert DataLake(root).read_manifest(run_id).pid != os.getpid()  # run by the worker, not here


# An async run (trainer.max_staleness): the sampler lane's task runs of batch n + k run while the update task run of
# iteration n runs, for a run of the command and for a run of the train deployment on the process worker.


def _task_runs(server, name: str) -> dict[str, tuple[float, float]]:
    """The task runs of the flow run ``name``: (start, end) in seconds, by task run name."""
    from prefect.client.schemas import filters as f

    with _client(server) as client:
        [run] = client.read_flow_runs(flow_run_filter=f.FlowRunFilter(name=f.FlowRunFilterName(any_=[name])))
        assert run.state.type.value == "COMPLETED"
        by_run = f.TaskRunFilter(flow_run_id=f.TaskRunFilterFlowRunId(any_=[run.id]))
        tasks = client.read_task_runs(task_run_filter=by_run)
    return {t.name: (t.start_time.timestamp(), t.end_time.timestamp()) for t in tasks if t.start_time and t.end_time}


def _overlap(spans: dict[str, tuple[float, float]], staleness: int, steps: range) -> None:
    """In each of ``steps``, the sampler lane of batch n + staleness (generate .. filter) and the update of n run at
    once, and the lane's stages run in their order."""
    for n in steps:
        ahead = n + staleness
        generate, filtered, update = spans[f"generate-i{ahead}"], spans[f"filter-i{ahead}"], spans[f"update-i{n}"]
        assert generate[0] < update[1] and update[0] < filtered[1], (n, spans)  # the two intervals intersect
        lane = [spans[f"{stage}-i{ahead}"] for stage in ("generate", "persist", "validate", "filter")]
        assert all(a[1] <= b[0] for a, b in zip(lane, lane[1:], strict=False)), lane
        assert spans[f"commit-i{n}"][0] >= max(update[1], filtered[1])  # the commit waits for both lanes


def test_a_command_line_async_run_shows_the_lanes_side_by_side(server, tiny_model_dir):
    # validation only at 0 and after the last update: steps 1 and 2 are the update alone
    overrides = [*async_overrides(tiny_model_dir, staleness=1, iterations=4, eval_every=10), *LONG_UPDATE]
    _ragen(server, ["train", "--config", "configs/bandit.yaml", "--run-id", "async-ui", *overrides])
    _overlap(_task_runs(server, "async-ui"), 1, range(1, 3))


def test_a_deployment_runs_an_async_run_with_two_batches_ahead(server, deployed):
    [run_id] = [row["run_id"] for row in query(deployed.root, "SELECT run_id FROM runs").to_pylist()]
    _overlap(_task_runs(server, run_id), 2, range(1, 2))
    rows = query(deployed.root, "SELECT DISTINCT iteration, policy_version FROM trajectories WHERE split = 'train'")
    assert sorted((r["iteration"], r["policy_version"]) for r in rows.to_pylist()) == [(0, 0), (1, 0), (2, 0), (3, 1)]


# Every door refuses the same input the same way (issue 53, section 3): one bad input sent through the ``ragen``
# command, the Python API and a run of the ``train`` deployment is refused by the request's builder with one
# message, word for word, and nothing is written to the data root: a data root that is a file, and a precision this
# machine cannot run (checked before only by the command line; skipped where a CUDA device is visible).

REFUSED_TINY = ["trainer.iterations=1", "bootstrap.enabled=false", "rollout.env_groups=2", "eval.instances=2"]


def _through_the_command(server, data_root, overrides: list[str]) -> str:
    done = subprocess.run(
        [RAGEN, "train", "--config", "configs/bandit.yaml", "--data-root", str(data_root), *overrides],
        env=dict(server.env),
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    return line.removeprefix("error: ")


def _through_the_api(data_root, overrides: list[str]) -> str:
    with pytest.raises(refusals()) as refused:
        ragen_core.train(str(PROJECT_DIR / "configs" / "bandit.yaml"), data_root, overrides=overrides)
    return str(refused.value)


def _through_a_deployment(server, data_root, overrides: list[str]) -> str:
    parameters = {"config": "configs/bandit.yaml", "data_root": str(data_root), "overrides": overrides}
    flow_run = _run_deployment(server, parameters)
    with _client(server) as client:
        state = client.read_flow_run(flow_run.id).state
    assert state.type.value == "FAILED", state
    return state.message


def _refused_alike(server, data_root, overrides: list[str]) -> str:
    said = _through_the_command(server, data_root, overrides)
    assert _through_the_api(data_root, overrides) == said
    assert said in _through_a_deployment(server, data_root, overrides)
    return said


def test_a_data_root_that_is_a_file_is_refused_alike_by_every_door(server, tmp_path):
    data_root = tmp_path / "lake.txt"
    data_root.write_text("not a folder\n")
    said = _refused_alike(server, data_root, [server.model, *REFUSED_TINY])
    assert said == f"data root {str(data_root)!r} is a file, not a folder; name a folder as the data root"
    assert data_root.read_text() == "not a folder\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs bf16: the input is then no mistake")
def test_a_precision_this_machine_cannot_run_is_refused_alike_by_every_door(server, tmp_path):
    data_root = tmp_path / "lake"
    said = _refused_alike(server, data_root, [server.model, *REFUSED_TINY, "trainer.precision=bf16"])
    assert said.startswith("trainer.precision=bf16 needs a CUDA GPU and none is visible")
    assert not data_root.exists()  # refused before the data root was made
