"""The update stage in a launched group (trainer.launcher=torchrun, 2 processes, gloo, ZeRO-2): the run completes,
resumes after a SIGKILL without leaving orphan processes, and its rows match the in-process run's.

Why exact rows: with 2 ranks and micro_batch_size = mini_batch_size / 2, each rank runs exactly one micro-batch per
optimizer step, so the reduced gradient is g0 + g1 (times 2 for DeepSpeed's average, then halved: exact in binary),
the same sum the one-process run accumulates. The weights after every update are therefore bitwise equal, and so
are the sampled rollouts. Only the logged gradient norm differs in the last bits (DeepSpeed's ZeRO computes it over
the flat partitions; one process sums per-tensor norms): compared to 1e-5 relative. ``config_hash`` differs by
construction (the launcher is part of the config).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake
from ragen_core.training.group import process_alive

pytestmark = pytest.mark.slow  # three CLI runs, two of them starting a 2-process group (about 2.5 minutes)
RUN = "l"
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
LAUNCHED = ["trainer.launcher=torchrun", "trainer.nproc=2", "actor.zero_stage=2"]
NOT_COMPARED = {"created_at", "updated_at", "config_hash"}
LAST_BITS = ("actor/grad_norm", "actor/grad_norm_max")  # computed differently by ZeRO (see the module docstring)


def _overrides(model_dir):
    return [
        f"model.path={model_dir}",
        "seed=5",
        "env.val_envs=[bandit]",
        "rollout.env_groups=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=2",
        "algorithm.filter_ratio=1.0",
        "trainer.iterations=4",
        "trainer.num_threads=1",
        "trainer.checkpoint_every=2",
        "eval.every=2",
        "eval.instances=2",
        "bootstrap.enabled=false",
    ]


def _ragen(args, root, api_url, fault=None):
    """Run the CLI in its own process group, talking to the Prefect server at ``api_url`` (the session's: no
    temporary server per process). After a fault kill, wait (up to 30 s) for the update group recorded in the
    manifest to exit on its own; only then kill whatever is left.
    Returns (exit code, output, pids of the update group still alive after the wait)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env["PREFECT_API_URL"] = api_url
    if fault:
        env["RAGEN_FAULT"] = fault
    script = str(Path(sys.executable).with_name("ragen"))
    log = Path(root) / f".log-{len(list(Path(root).glob('.log-*')))}.txt"
    survivors: list[int] = []
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [script, *args, "--data-root", str(root)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            process.wait(timeout=400)
            manifest = DataLake(root).read_manifest(RUN)
            group = (manifest.update_group if manifest is not None else None) or {}
            pids = [group.get("launcher_pid"), *group.get("worker_pids", [])] if fault else []
            deadline = time.monotonic() + 30
            while any(process_alive(p, None) for p in pids if p) and time.monotonic() < deadline:
                time.sleep(0.2)
            survivors = [p for p in pids if p and process_alive(p, None)]
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return process.returncode, log.read_text(), survivors


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tiny_policy, prefect_server):
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: build it here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    inprocess = tmp_path_factory.mktemp("inprocess")
    api_url = prefect_server[0].api_url
    rc, output, _ = _ragen(train, inprocess, api_url)
    assert rc == 0, output[-3000:]
    launched = tmp_path_factory.mktemp("launched")
    # killed inside iteration 3's update: the group has stepped, nothing is saved; the checkpoint after update 2
    # is loaded (both ranks' ZeRO-2 shards) on resume and the batch of iteration 3 is trained on again
    rc, output, survivors = _ragen([*train, *LAUNCHED], launched, api_url, fault="update:inside@3")
    assert rc == -signal.SIGKILL, output[-3000:]
    manifest = DataLake(launched).read_manifest(RUN)
    # the manifest's launcher is used only when the user names it again (a stored config never starts processes)
    rc, resumed, _ = _ragen(["resume", RUN, "trainer.launcher=torchrun"], launched, api_url)
    assert rc == 0, resumed[-3000:]
    return inprocess, launched, survivors, manifest


def test_the_group_dies_with_the_run_and_the_run_resumes(runs):
    _, launched, survivors, killed_manifest = runs
    group = killed_manifest.update_group
    assert (group["launcher"], group["nproc"], group["world_size"], len(group["worker_pids"])) == ("torchrun", 2, 2, 2)
    assert survivors == [], f"processes of the killed run's update group still alive: {survivors}"
    manifest = DataLake(launched).read_manifest(RUN)
    assert manifest.status == "completed" and manifest.precision == "fp32"
    assert DataLake(launched).committed_iterations(RUN) == [0, 1, 2, 3, 4]
    attempt = manifest.resumes[-1]
    assert attempt["checkpoint_updates"] == 2 and attempt["replayed"] == [2]
    assert attempt["update_group"]["world_size"] == 2 and attempt["precision"] == "fp32"


def _rows(root, table):
    rows = DataLake(root).read_table(table, RUN).to_pylist()
    if table == "metrics":
        rows = [r for r in rows if not r["name"].startswith(("time/", "perf/")) and r["name"] not in LAST_BITS]
    return sorted(repr(sorted((k, v) for k, v in r.items() if k not in NOT_COMPARED)) for r in rows)


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_rows_match_the_in_process_run(runs, table):
    inprocess, launched, _, _ = runs
    expected, actual = _rows(inprocess, table), _rows(launched, table)
    assert len(actual) == len(set(actual)) == len(expected) > 0
    assert actual == expected


def test_gradient_norms_and_final_weights_match(runs):
    inprocess, launched, _, _ = runs
    norms = {}
    for root in (inprocess, launched):
        rows = DataLake(root).read_table("metrics", RUN).to_pylist()
        norms[root] = {(r["iteration"], r["name"]): r["value"] for r in rows if r["name"] in LAST_BITS}
    assert len(norms[inprocess]) == 8 and norms[inprocess].keys() == norms[launched].keys()
    for key, value in norms[inprocess].items():
        assert norms[launched][key] == pytest.approx(value, rel=1e-5), key
    final = [
        load_file(root / "runs" / RUN / "checkpoints" / "iteration=4" / "hf" / "model.safetensors")
        for root in (inprocess, launched)
    ]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
