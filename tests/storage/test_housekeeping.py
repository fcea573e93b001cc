"""The runs overview and the removal of a whole run (what it owns, refusals, a crash half-way)."""

import shutil
import subprocess
import sys

import pytest

from ragen_core.storage import DataLake, checkpoint_row, query
from ragen_core.storage.maintenance import RunActiveError, RunNotFoundError, plan_removal, remove_run, runs_overview
from ragen_core.storage.maintenance import housekeeping as housekeeping_module
from schemas.manifest import RunManifest
from tests.storage.synthetic import make_run, write_run


def _lake(tmp_path):
    lake = DataLake(tmp_path)
    keep, gone = make_run(1, "keep", "sokoban", 2), make_run(2, "gone", "bandit", 1)
    write_run(lake, keep, created="2025-01-01T00:00:00+00:00")
    write_run(lake, gone, created="2025-01-02T00:00:00+00:00")
    return lake, keep, gone


def _owned_extras(lake: DataLake, run_id: str) -> list:
    """Staging, quarantine, a Prefect home and a checkpoint folder of the run (the lake's own writers make them)."""
    checkpoint = lake.run_dir(run_id) / "checkpoints" / "iteration=1"
    checkpoint.mkdir(parents=True)
    lake.write_rows("checkpoints", run_id, 1, [checkpoint_row(run_id, 1, str(checkpoint), "hf", {})], stage="ckpt")
    # a row written when the data root lay elsewhere (moved or copied since): the same layout under another root
    outside = lake.root.parent / f"old-root-{lake.root.name}" / "runs" / run_id / "checkpoints" / "iteration=0"
    outside.mkdir(parents=True)
    lake.write_rows("checkpoints", run_id, 0, [checkpoint_row(run_id, 0, str(outside), "hf", {})], stage="ckpt")
    lake.stage_table(run_id, 5, "rollout", "metrics", lake.spec("metrics").arrow_schema.empty_table())
    lake.quarantine(run_id, 5, "rollout", '{"ok": false}')
    (lake.root / "_prefect" / run_id).mkdir(parents=True)
    return [checkpoint, lake.quarantine_dir(run_id, 5, "rollout"), lake.root / "_prefect" / run_id, outside]


def test_overview_lists_status_hash_iterations_and_last_validation(tmp_path):
    lake, keep, gone = _lake(tmp_path)
    rows = runs_overview(lake).to_pylist()
    assert [r["run_id"] for r in rows] == ["keep", "gone"]  # by created_at
    last = {r.run_id: r.metrics[max(r.metrics)] for r in (keep, gone)}
    assert rows[0]["val_success"] == f"sokoban {last['keep']['val/sokoban/success']:.3f}"
    assert rows[1]["val_success"] == f"bandit {last['gone']['val/bandit/success']:.3f}"
    assert [(r["status"], r["config_hash"], r["iterations"], r["val_iteration"]) for r in rows] == [
        ("completed", "h-keep", 3, 2),
        ("completed", "h-gone", 2, 1),
    ]


def test_overview_falls_back_to_the_validation_metrics(tmp_path):
    lake = DataLake(tmp_path)
    lake.write_manifest("m", RunManifest(run_id="m", status="failed", created_at="2025-01-01T00:00:00+00:00"))
    rows = [
        {"run_id": "m", "iteration": 4, "name": n, "value": v}
        for n, v in (("val/bandit/success", 0.25), ("val/countdown/success", 0.5), ("rollout/reward_mean", 9.0))
    ]
    lake.write_rows("metrics", "m", 4, rows, stage="commit")
    (row,) = runs_overview(lake).to_pylist()
    assert (row["val_iteration"], row["val_success"]) == (4, "bandit 0.250, countdown 0.500")


def test_remove_deletes_everything_the_run_owns_and_nothing_else(tmp_path):
    lake, keep, gone = _lake(tmp_path)
    extras = _owned_extras(lake, "gone")
    keep_rows = {t: lake.read_table(t, "keep").to_pylist() for t in ("trajectories", "turns", "metrics")}

    plan = plan_removal(lake, "gone")
    assert plan.rows["trajectories"] == len(gone.trajectories) and plan.rows["checkpoints"] == 2
    assert {extras[0], extras[1].parent.parent, extras[2], lake.run_dir("gone")} <= set(plan.paths)
    assert extras[3] not in plan.paths  # a checkpoint outside the data root is not the lake's to delete
    remove_run(lake, plan)

    for table in lake.tables:
        assert lake.read_table(table, "gone").num_rows == 0, table
    assert not any(p.exists() for p in extras[:3]) and extras[3].is_dir()
    for folder in ("_commits", "_staging", "runs"):
        assert not (tmp_path / folder / "gone").exists(), folder
    assert not list(tmp_path.rglob("*gone*"))
    assert {t: lake.read_table(t, "keep").to_pylist() for t in keep_rows} == keep_rows
    assert query(lake, "SELECT DISTINCT run_id FROM trajectories").to_pylist() == [{"run_id": "keep"}]
    with pytest.raises(RunNotFoundError, match="unknown run 'gone'.*runs: keep"):
        plan_removal(lake, "gone")


def _hold_writer(lake: DataLake, run_id: str) -> subprocess.Popen:
    """Another process holding ``run_id``'s writer lock (a live writer), once it says so."""
    code = (
        "import time; from ragen_core.storage.locks import run_writer\n"
        f"with run_writer({str(lake.root)!r}, {run_id!r}):\n    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_running_run_is_refused_while_its_writer_lives_and_is_interrupted_once_it_died(tmp_path):
    """Issue 66: `running` is what a manifest says while its writer lives; once no process holds the run's writer
    lock (the writer was SIGKILLed after its last commit), the run is listed and removed as interrupted, no --force."""
    lake = DataLake(tmp_path)
    write_run(lake, make_run(5, "live", "bandit", 1), status="running")
    holder = _hold_writer(lake, "live")
    try:
        with pytest.raises(RunActiveError, match="still 'running'.*--force"):
            plan_removal(lake, "live")
        assert [row["status"] for row in runs_overview(lake).to_pylist()] == ["running"]
    finally:
        holder.kill()
        holder.wait()
    assert [row["status"] for row in runs_overview(lake).to_pylist()] == ["interrupted"]
    assert lake.read_manifest("live").status == "running"  # listed as what it is; the manifest is not rewritten
    plan = plan_removal(lake, "live")
    assert plan.status == "interrupted"
    remove_run(lake, plan)
    assert not (tmp_path / "runs" / "live").exists()


def test_a_bootstrap_run_owns_its_model_and_names_the_runs_that_used_it(tmp_path):
    lake = DataLake(tmp_path)
    model = lake.models_dir() / "bootstrap-abc"
    model.mkdir(parents=True)
    (lake.models_dir() / "tiny-1").mkdir()
    stamp = "2025-01-01T00:00:00"
    built = RunManifest(
        run_id="bootstrap-abc", kind="bootstrap", status="completed", model_dir=str(model), updated_at=stamp
    )
    lake.write_manifest("bootstrap-abc", built)
    lake.write_manifest("user", RunManifest(run_id="user", status="completed", model_dir=str(model), updated_at=stamp))
    plan = plan_removal(lake, "bootstrap-abc")
    assert model in plan.paths and plan.warnings == ["runs that started from its model bootstrap-abc: user"]
    remove_run(lake, plan)
    assert not model.exists() and (lake.models_dir() / "tiny-1").is_dir() and lake.read_manifest("user")
    assert plan_removal(lake, "user").paths == [lake.run_dir("user")]  # a train run does not own its start model


def test_a_removal_that_crashed_half_way_is_finished_by_the_next_one(tmp_path, monkeypatch):
    lake, keep, gone = _lake(tmp_path)
    plan = plan_removal(lake, "gone")
    calls = []
    real_rmtree = shutil.rmtree

    def crash_on_second(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(housekeeping_module.shutil, "rmtree", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        remove_run(lake, plan)
    monkeypatch.undo()
    assert lake.read_manifest("gone").status == "deleting"
    for table in ("trajectories", "turns"):  # renamed away before the crash: invisible, not half-visible
        assert query(lake, f"SELECT count(*) AS n FROM {table} WHERE run_id = 'gone'").to_pylist() == [{"n": 0}]
    remove_run(lake, plan_removal(lake, "gone"))  # 'deleting' is not 'running': no --force needed
    assert not list(tmp_path.rglob("*gone*"))
    assert lake.read_table("trajectories", "keep").num_rows == len(keep.trajectories)


def test_a_damaged_file_does_not_keep_its_run_from_being_removed(tmp_path):
    lake, keep, gone = _lake(tmp_path)
    _owned_extras(lake, "gone")
    (damaged,) = lake.partition_files("checkpoints", "gone", 1)
    damaged.write_bytes(damaged.read_bytes()[:20])
    plan = plan_removal(lake, "gone")
    assert plan.rows["checkpoints"] is None and "checkpoints table cannot be read" in plan.warnings[0]
    assert "checkpoints: ? row(s)" in plan.describe(tmp_path)
    remove_run(lake, plan)
    assert not list(tmp_path.rglob("*gone*"))


def test_runs_rm_never_removes_a_run_whose_writer_is_alive(tmp_path):
    import subprocess
    import sys
    import time

    from typer.testing import CliRunner

    from ragen_cli.main import app
    from ragen_core.storage.locks import lock_path, read_holder

    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "live", "bandit", iterations=1), status="running")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from ragen_core.storage.locks import run_writer\n"
                f"with run_writer({str(lake.root)!r}, 'live'):\n    print('held', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.relative_to(lake.root) for p in lake.root.rglob("*") if p.name != "writer.lock")
        result = CliRunner().invoke(app, ["runs", "rm", "live", "--force", "--yes", "--data-root", str(lake.root)])
        assert result.exit_code == 2, result.output
        assert f"pid {holder.pid}" in " ".join(result.output.split()) and "removed run" not in result.output
        after = sorted(p.relative_to(lake.root) for p in lake.root.rglob("*") if p.name != "writer.lock")
        assert after == before and lake.read_manifest("live").status == "running"
        assert read_holder(lock_path(lake.root, "live"))["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    result = CliRunner().invoke(app, ["runs", "rm", "live", "--force", "--yes", "--data-root", str(lake.root)])
    assert result.exit_code == 0 and not lake.run_dir("live").exists()  # the writer is gone: --force removes it


def test_prefect_homes_of_commands_that_are_not_runs_are_no_runs(tmp_path):
    """`eval`, a sweep's and `reproduce-<finding>`'s Prefect homes live beside the runs' own: none is a run that
    `runs rm`, `sql --run`, `plot` or `export` would take, nor one the refusal lists; a run's own goes with it."""
    lake, _, _ = _lake(tmp_path)
    for name in ("eval", "sweep-52c218dc", "reproduce-echo_trap", "keep"):
        (lake.root / "_prefect" / name / "20261127T000000-1").mkdir(parents=True)
    assert housekeeping_module.runs_with_data(lake) == {"keep", "gone"}
    with pytest.raises(RunNotFoundError, match=r"unknown run 'eval'.*runs: gone, keep$"):
        plan_removal(lake, "eval")
    assert lake.root / "_prefect" / "keep" in plan_removal(lake, "keep").paths
