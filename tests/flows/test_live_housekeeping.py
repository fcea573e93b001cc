"""Housekeeping beside a live writer (issue 39, "not yet attacked"): `ragen export` of a run while it trains, and
`ragen runs rm` of a sweep's points while the sweep runs. Every stored row is kept, and each command gives a clear
answer: the export takes the iterations committed when it began (the rows of the iteration in flight are not final:
a resume would discard and redo them) and says which it left out; `runs rm` refuses the point being trained (naming
its status, or with --force its writer) and removes a finished point whole, and the sweep then goes on, its other
points untouched, its comparison saying that the removed point's run is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake
from tests.flows.test_resume import DISTRIBUTED, _overrides

ITERATIONS = 4
GROUPS, GROUP_SIZE, VAL = 2, 4, 2  # rollout.env_groups, group_size, eval.instances of _overrides (one val env)


def _start(args: list[str], root: Path, log: Path, api_url: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env["PREFECT_API_URL"] = api_url
    handle = open(log, "w")  # noqa: SIM115 - closed by _finish
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("ragen")), *args, "--data-root", str(root)],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    process.log = handle  # type: ignore[attr-defined]
    return process


def _finish(process: subprocess.Popen, timeout: float = 600) -> int:
    try:
        return process.wait(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.log.close()  # type: ignore[attr-defined]


def _wait_for(condition, process: subprocess.Popen, log: Path, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"finished before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_refusal(result, *expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.stderr
    text = " ".join(result.stderr.split())
    for piece in expected:
        assert piece in text, (piece, text)


def _rows(table) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True, default=repr) for row in table.to_pylist())


def _committed(lake: DataLake, run_id: str) -> list[int]:
    try:
        return lake.committed_iterations(run_id)
    except OSError:  # its folder is being created
        return []


def test_export_during_training_takes_the_committed_iterations_and_says_what_it_left_out(
    tmp_path, tiny_model_dir, prefect_server
):
    root, run_id = tmp_path / "lake", "live"
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith("trainer.iterations=")]
    log = tmp_path / "train.log"
    train = _start(
        [
            "train",
            "--config",
            "configs/bandit.yaml",
            "--run-id",
            run_id,
            *overrides,
            f"trainer.iterations={ITERATIONS}",
        ],
        root,
        log,
        prefect_server[0].api_url,
    )
    lake = DataLake(root)
    try:
        _wait_for(lambda: len(_committed(lake, run_id)) >= 2, train, log, "second committed iteration")
        result = _cli("export", run_id, "--out", tmp_path / "out", "--data-root", root)
        committed_after = _committed(lake, run_id)
    finally:
        assert _finish(train) == 0, log.read_text()[-3000:]
    assert result.exit_code == 0, result.output
    readme = (tmp_path / "out" / "README.md").read_text()
    exported = pq.read_table(sorted((tmp_path / "out").rglob("*.parquet")))
    iterations = sorted(set(exported["iteration"].to_pylist()))
    assert iterations == list(range(len(iterations))) and 2 <= len(iterations) <= len(committed_after)
    assert f"committed iterations 0-{iterations[-1]}" in readme
    if "left out" in result.output:  # the iteration in flight had published rows: named, never exported
        assert f"{run_id} iteration(s) {iterations[-1] + 1}" in " ".join(result.output.split())
    # every exported row is the run's final row, and every row of those iterations was exported
    final = lake.read_table("trajectories", run_id)
    final = final.filter(pc.is_in(final["iteration"], pc.unique(exported["iteration"])))
    assert _rows(exported) == _rows(final)
    # the training itself lost nothing: every configured row, once
    expected = ITERATIONS * GROUPS * GROUP_SIZE + (ITERATIONS + 1) * VAL
    assert lake.read_table("trajectories", run_id).num_rows == expected


def test_an_export_of_a_run_killed_mid_iteration_leaves_out_its_uncommitted_rows_and_says_so(
    tmp_path, tiny_model_dir, prefect_server
):
    """Killed right after iteration 2's rollouts were published (not committed): those rows are not final (a resume
    discards and redoes them), so the export leaves them out and names the iteration."""
    from tests.flows.test_resume import RUN, _ragen

    root = tmp_path / "lake"
    root.mkdir()
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    rc, output = _ragen(train, root, "publish:after@2", prefect_server[0].api_url)
    assert rc == -signal.SIGKILL, output[-3000:]
    lake = DataLake(root)
    assert lake.committed_iterations(RUN) == [0, 1]
    stored = lake.read_table("trajectories", RUN)
    assert 2 in stored["iteration"].to_pylist()  # the premise: rows of the uncommitted iteration are published
    result = _cli("export", RUN, "--out", tmp_path / "out", "--data-root", root)
    assert result.exit_code == 0, result.output
    assert f"left out, not committed yet (a run still training or stopped mid-iteration): {RUN} iteration(s) 2" in (
        " ".join(result.output.split())
    )
    exported = pq.read_table(sorted((tmp_path / "out").rglob("*.parquet")))
    committed = stored.filter(pc.is_in(stored["iteration"], pa.array([0, 1], stored["iteration"].type)))
    assert _rows(exported) == _rows(committed) and exported.num_rows == 2 * GROUPS * GROUP_SIZE + 2 * VAL
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "committed iterations 0-1 (left out, not committed then: 2)" in readme


def test_an_export_of_a_run_without_a_committed_iteration_is_refused(tmp_path):
    lake = DataLake(tmp_path / "lake")
    lake.write_rows(
        "metrics", "early", 0, [{"run_id": "early", "iteration": 0, "name": "m", "value": 1.0}], stage="commit"
    )
    _one_line_refusal(
        _cli("export", "early", "--out", tmp_path / "out", "--data-root", lake.root),
        "run 'early' has no committed iteration yet",
    )
    assert not (tmp_path / "out").exists()


def test_runs_rm_during_a_sweep_refuses_the_live_point_and_removes_a_finished_one_whole(
    tmp_path, tiny_model_dir, prefect_server
):
    root, log = tmp_path / "lake", tmp_path / "sweep.log"
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith(("seed=", "trainer.iterations="))]
    sweep = _start(
        [
            "sweep",
            "--config",
            "configs/bandit.yaml",
            "--seeds",
            "3",
            "--sweep-id",
            "live",
            *overrides,
            "trainer.iterations=2",
        ],
        root,
        log,
        prefect_server[0].api_url,
    )
    lake = DataLake(root)
    first, second, third = "live-p000", "live-p001", "live-p002"

    def status(run_id: str) -> str | None:
        try:
            manifest = lake.read_manifest(run_id)
            return manifest.status if manifest is not None else None
        except Exception:  # noqa: BLE001 - being written
            return None

    try:
        _wait_for(
            lambda: status(first) == "completed" and status(second) == "running",
            sweep,
            log,
            "the second point running",
        )
        _one_line_refusal(_cli("runs", "rm", second, "--yes", "--data-root", root), "still 'running'")
        _one_line_refusal(_cli("runs", "rm", second, "--yes", "--force", "--data-root", root), second)
        removed = _cli("runs", "rm", first, "--yes", "--data-root", root)
        assert removed.exit_code == 0, removed.output
    finally:
        rc = _finish(sweep)
    output = log.read_text()
    assert rc == 1, output[-3000:]  # not every point has its run now: said, and the status says it
    assert "Traceback" not in output
    assert f"removed while the sweep ran: {first}" in " ".join(output.split())
    assert lake.read_manifest(first) is None and lake.read_table("trajectories", first).num_rows == 0
    for run_id in (second, third):  # untouched: every configured row, the run completed
        assert status(run_id) == "completed"
        assert lake.read_table("trajectories", run_id).num_rows == 2 * GROUPS * GROUP_SIZE + 3 * VAL


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
