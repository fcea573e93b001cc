"""Whole runs on the device, through the command users type (``python -m ragen_cli.main``, each with its own
temporary Prefect server): a run SIGKILLed inside an update and resumed ends like the run that never stopped, and a
short `ragen train` of the demo config lifts Bandit's validation success.

Resume, which equality: every run asks torch for deterministic algorithms (warn-only) and the tests set
``CUBLAS_WORKSPACE_CONFIG``. On the CPU that makes the resumed run bitwise equal to the whole one, which is asserted
(as tests/flows/test_resume.py does). On CUDA some kernels have no deterministic version (the memory-efficient
attention backward accumulates with atomics), so there the test asserts: the same rows by key (nothing lost or
duplicated), bitwise the same iteration-0 rollouts (sampled before any update), every weight within bf16's tolerance
(2**-7 of the tensor's norm: storage rounding plus run-to-run noise of the updates; the key projection's bias, whose
true gradient is 0, excepted), and prints whether the rows and weights were bitwise equal anyway.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen_core.storage import DataLake, query
from tests.flows.test_resume import DISTRIBUTED, RUN, _overrides, _rows, _wait_then_reap, _weights

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
FAULT = "update:inside@1"  # killed while the device steps iteration 1's update; checkpoint_every=2: update 0 replays
TIMEOUT_S = {"cuda": 300, "cpu": 1200}  # per command: ~40 s on an H100; minutes on a loaded 2-core CPU


def _start(args: list[str], root: Path, fault: str | None = None) -> tuple[subprocess.Popen, Path]:
    """``python -m ragen_cli.main ARGS --data-root ROOT`` in its own process group and Prefect home; output to a
    file under the root."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env["PREFECT_HOME"] = str(root / ".prefect")  # a temporary server of its own: runs side by side never share one
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    if fault:
        env["RAGEN_FAULT"] = fault
    root.mkdir(parents=True, exist_ok=True)
    log = root / f".log-{len(list(root.glob('.log-*')))}.txt"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "ragen_cli.main", *args, "--data-root", str(root)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
    return process, log


def _finish(process: subprocess.Popen, log: Path, device: str) -> tuple[int, str]:
    """Wait for the command, then end whatever it left in its process group (a killed run's Prefect server)."""
    _wait_then_reap(process, TIMEOUT_S[device])
    return process.returncode, log.read_text()


def _keys(root: Path, table: str) -> list[tuple]:
    rows = DataLake(root).read_table(table, RUN).to_pylist()
    names = ("iteration", "split", "env", "group_id", "traj_index", "turn_index")
    return sorted(tuple(r.get(n) for n in names) for r in rows)


def test_a_run_killed_on_the_device_resumes_to_the_same_rows_and_weights(device, tmp_path, tiny_model_dir):
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    started = time.monotonic()
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    runs = [_start(train, whole), _start(train, killed, FAULT)]  # side by side: the device has room for both
    (whole_rc, whole_log), (killed_rc, killed_log) = (_finish(*run, device.name) for run in runs)
    assert whole_rc == 0, whole_log[-3000:]
    assert killed_rc == -signal.SIGKILL, f"exit {killed_rc}\n{killed_log[-3000:]}"
    rc, output = _finish(*_start(["resume", RUN], killed), device.name)
    assert rc == 0, output[-3000:]
    assert "resumed at iteration" in output
    print(f"on {device.name}: whole and killed runs side by side, then the resume: {time.monotonic() - started:.0f} s")

    lake = DataLake(killed)
    manifest = lake.read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == 1
    assert manifest.precision == ("bf16" if device.cuda else "fp32")  # trainer.precision=auto
    assert lake.committed_iterations(RUN) == [0, 1, 2, 3]
    expected, actual = _weights(whole), _weights(killed)
    assert expected.keys() == actual.keys()
    rows_bitwise = all(_rows(whole, t) == _rows(killed, t) for t in ("trajectories", "turns", "metrics"))
    weights_bitwise = all(torch.equal(expected[name], actual[name]) for name in expected)
    print(f"on {device.name}: rows bitwise equal: {rows_bitwise}; weights bitwise equal: {weights_bitwise}")
    if not device.cuda:
        assert rows_bitwise and weights_bitwise
        return
    for table in ("trajectories", "turns"):
        keys = _keys(killed, table)
        assert keys == _keys(whole, table) and len(set(keys)) == len(keys), table  # nothing lost, nothing twice
    first = (
        "SELECT group_id, traj_index, input_ids, total_reward FROM trajectories "
        "WHERE iteration = 0 AND split = 'train'"
    )
    assert sorted(map(repr, query(whole, first).to_pylist())) == sorted(map(repr, query(killed, first).to_pylist()))
    for name, want in expected.items():
        if name.endswith("k_proj.bias"):
            continue  # its true gradient is 0 (softmax ignores a shift shared by all keys): AdamW steps noise by ~lr
        error = (actual[name].float() - want.float()).norm()
        assert error <= 2.0**-7 * want.float().norm(), f"{name}: {error:.3g} off the whole run's weights"


def test_ragen_train_of_the_demo_config_lifts_bandit_success(device, tmp_path):
    """`ragen train --config configs/bandit.yaml` (the tiny model, its bootstrap, StarPO-S), a few iterations:
    validation success on Bandit rises from chance (after the random-arm bootstrap the policy picks the better arm
    about half the time) to at least 0.8 (measured on an H100: 0.434 -> 0.953 after 5 iterations)."""
    iterations = 5
    args = [
        "train",
        "--config",
        "configs/bandit.yaml",
        "--run-id",
        "demo",
        f"trainer.iterations={iterations}",
        "eval.instances=128",
        "env.val_envs=[bandit]",
    ]
    started = time.monotonic()
    rc, output = _finish(*_start(args, tmp_path), device.name)
    assert rc == 0, output[-3000:]
    rows = query(
        tmp_path,
        "SELECT iteration, avg(success::int) AS s FROM trajectories WHERE split = 'val' "
        "AND run_id = 'demo' GROUP BY 1 ORDER BY 1",
    ).to_pylist()
    assert [r["iteration"] for r in rows] == [0, iterations]
    before, after = rows[0]["s"], rows[-1]["s"]
    print(
        f"on {device.name}: Bandit validation success {before:.3f} -> {after:.3f} in {iterations} iterations, "
        f"{time.monotonic() - started:.0f} s"
    )
    assert 0.3 < before < 0.7
    assert after >= 0.8
