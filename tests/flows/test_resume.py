"""Exact resume: a run killed (SIGKILL, via RAGEN_FAULT) at five different points and resumed each time ends with
bitwise the same weights and the same rows as the run that never stopped."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake

RUN = "r"
DISTRIBUTED = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PREFECT_HOME",
    "PREFECT_API_URL",
    "RAGEN_FAULT",
}
# (fault, expected: killed or not). Iteration 1 is hit at every point; the checkpoint after update 2 is cut mid-save.
FAULTS = ["rollout:inside@1", "persist:mid_write@1", "publish:after@1", "update:inside@1", "checkpoint:mid_save@2"]
WALL_CLOCK_COLUMNS = {"created_at", "updated_at"}


def _overrides(model_dir):
    return [
        f"model.path={model_dir}",
        "seed=3",
        "env.val_envs=[bandit]",
        "rollout.env_groups=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=3",
        "trainer.num_threads=1",
        "trainer.checkpoint_every=2",
        "eval.every=1",
        "eval.instances=2",
        "bootstrap.enabled=false",
        # 8 new tokens keep these runs fast, and the untrained model's replies never end within them: the truncation
        # warning would be right, and would add a line to the output that the stop tests read as one line
        "monitor.truncated_share=null",
    ]


def _ragen(args, root, fault=None, api_url=None, on_exit=None):
    """Run the installed CLI in its own process group; afterwards kill whatever the process left behind (a killed
    run's Prefect server, which would also hold a pipe open: so the output goes to a file). With ``api_url`` the run
    talks to that Prefect server instead of starting a temporary one (seconds saved per attempt); ``on_exit`` is
    called once the command has exited, before its process group is reaped (what its survivors do alone)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    if fault:
        env["RAGEN_FAULT"] = fault
    script = str(Path(sys.executable).with_name("ragen"))
    log = Path(root) / f".log-{len(list(Path(root).glob('.log-*')))}.txt"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [script, *args, "--data-root", str(root)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        _wait_then_reap(process, 400, on_exit)
    return process.returncode, log.read_text()


def _wait_then_reap(process: subprocess.Popen, timeout: float, on_exit=None) -> None:
    """Wait for a command started in its own session (then call ``on_exit``, when given), then kill whatever it left
    in its process group (a killed run's Prefect server), however the wait ended."""
    try:
        process.wait(timeout=timeout)
        if on_exit is not None:
            on_exit()
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tiny_policy, prefect_server, whole_bandit_run):
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: build it here, never inside a process that gets killed
    model, _ = tiny_policy
    ActorEngine(model, OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    overrides = _overrides(tiny_model_dir)
    whole = whole_bandit_run  # the same command and config, never stopped (tests/flows/conftest.py)
    api_url = prefect_server[0].api_url  # one real server for all the processes (killed ones included)
    killed = tmp_path_factory.mktemp("killed")
    log = []
    for attempt, fault in enumerate(FAULTS):
        args = (
            ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *overrides]
            if attempt == 0
            else ["resume", RUN]
        )
        rc, output = _ragen(args, killed, fault, api_url)
        log.append((fault, rc))
        assert rc == -signal.SIGKILL, f"{fault}: exit {rc}\n{output[-3000:]}"
    rc, output = _ragen(["resume", RUN], killed, None, api_url)
    assert rc == 0, output[-3000:]
    assert "resumed at iteration" in output
    return whole, killed, log


def _weights(root):
    folder = DataLake(root).root / "runs" / RUN / "checkpoints" / "iteration=3" / "hf"
    return load_file(folder / "model.safetensors")


def test_final_weights_are_bitwise_identical(runs):
    whole, killed, _ = runs
    expected, actual = _weights(whole), _weights(killed)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def _rows(root, table):
    rows = DataLake(root).read_table(table, RUN).to_pylist()
    if table == "metrics":
        rows = [r for r in rows if not r["name"].startswith(("time/", "perf/"))]
    cleaned = [{k: v for k, v in r.items() if k not in WALL_CLOCK_COLUMNS} for r in rows]
    return sorted(repr(sorted(r.items())) for r in cleaned)


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_tables_hold_exactly_the_same_rows(runs, table):
    whole, killed, _ = runs
    expected, actual = _rows(whole, table), _rows(killed, table)
    assert len(actual) == len(set(actual)) == len(expected)  # nothing duplicated, nothing lost
    assert actual == expected


def test_the_killed_run_is_completed_and_remembers_its_resumes(runs):
    _, killed, log = runs
    manifest = DataLake(killed).read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == len(FAULTS)
    assert DataLake(killed).committed_iterations(RUN) == [0, 1, 2, 3]
    # resumes[j] is the attempt after the kill at FAULTS[j]: the finished stages of iteration 1 it reused
    reused = [attempt.get("reused_stages") for attempt in manifest.resumes]
    assert reused == [
        ["eval-bandit"],  # killed inside the rollout: the validation of iteration 1 was already published
        ["eval-bandit"],  # killed mid Parquet write of the rollout batch (the validation was reused again)
        ["eval-bandit", "rollout"],  # killed after the publish: the batch is trained on, not regenerated
        ["eval-bandit", "rollout"],  # killed inside the update
        ["eval-bandit", "rollout"],  # killed mid checkpoint save, in the commit stage
    ]
    assert not list((killed / "runs" / RUN / "checkpoints").glob(".*"))  # no half-written checkpoint left
