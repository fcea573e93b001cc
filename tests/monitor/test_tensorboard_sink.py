"""TensorBoard sink: event files written by the sink, read back with TensorBoard's own reader, equal the metrics rows
(as float32, TensorBoard's scalar type) that DuckDB reads from the lake's Parquet files."""

from __future__ import annotations

import logging

import duckdb
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ragen_core.monitor.tensorboard_sink import (
    event_file_name,
    rebuild_tensorboard,
    record_iteration,
    write_scalars,
)
from ragen_core.storage import DataLake, LakeError

NAMES = ("rollout/reward_mean", "actor/entropy", "val/bandit/success", "time/update")


def read_events(folder) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard loads the folder (every scalar kept, no sampling)."""
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def duckdb_metrics(root, run_id: str, float32: bool = True) -> dict[str, list[tuple[int, float]]]:
    """name -> [(iteration, value as float32, as TensorBoard keeps it; ``float32=False``: float64, as stored)]
    straight from the Parquet files (hive partitions), not via our code."""
    rows = duckdb.sql(
        f"SELECT iteration, name, value FROM read_parquet('{root}/metrics/*/*/*.parquet', hive_partitioning = true) "
        f"WHERE run_id = '{run_id}' ORDER BY name, iteration"
    ).fetchall()
    out: dict[str, list[tuple[int, float]]] = {}
    for iteration, name, value in rows:
        out.setdefault(name, []).append((int(iteration), float(np.float32(value)) if float32 else float(value)))
    return out


def _lake_with_metrics(tmp_path, run_id: str, iterations: int) -> tuple[DataLake, dict[int, dict[str, float]]]:
    """Metrics rows written and committed through the real lake API; awkward values (thirds, tiny, huge, negative)
    so a float64 -> float32 mismatch or a mixed-up tag would show."""
    lake = DataLake(tmp_path / "lake")
    rng = np.random.default_rng(7)
    written: dict[int, dict[str, float]] = {}
    for iteration in range(iterations):
        values = {name: float(rng.normal() * 10.0 ** int(rng.integers(-30, 30))) for name in NAMES}
        values["rollout/reward_mean"] = iteration / 3
        if iteration % 2:  # validation only at even iterations, as with eval.every = 2
            del values["val/bandit/success"]
        rows = [{"run_id": run_id, "iteration": iteration, "name": k, "value": v} for k, v in sorted(values.items())]
        lake.write_rows("metrics", run_id, iteration, rows, stage="commit")
        lake.commit_iteration(run_id, iteration, {"metrics": len(rows)})
        written[iteration] = values
    return lake, written


def test_written_events_read_back_equal_the_metrics_table(tmp_path):
    lake, written = _lake_with_metrics(tmp_path, "run-a", 12)
    for iteration, values in written.items():  # what commit_iteration does after each commit
        assert record_iteration(lake, "run-a", iteration, values) is not None
    folder = lake.tensorboard_dir("run-a")
    assert folder == lake.root / "runs" / "run-a" / "tensorboard"
    events = read_events(folder)
    expected = duckdb_metrics(lake.root, "run-a")
    assert events == expected
    assert [step for step, _ in events["val/bandit/success"]] == [0, 2, 4, 6, 8, 10]
    assert events["rollout/reward_mean"][4] == (4, float(np.float32(4 / 3)))  # float32, not float64
    assert events["rollout/reward_mean"][4][1] != 4 / 3


def test_file_names_sort_in_step_order_and_rewriting_replaces(tmp_path):
    folder = tmp_path / "tb"
    for step in (100, 9, 10, 0):
        write_scalars(folder, step, {"x": float(step)}, wall_time=1000.0 + step)
    names = sorted(p.name for p in folder.iterdir())
    assert names == [event_file_name(s) for s in (0, 9, 10, 100)]
    assert names[1] == "events.out.tfevents.0000000009.ragen"
    write_scalars(folder, 9, {"x": -1.0})  # the same iteration again: its file is replaced, not doubled
    assert len(list(folder.iterdir())) == 4
    assert read_events(folder)["x"] == [(0, 0.0), (9, -1.0), (10, 10.0), (100, 100.0)]
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    assert [e.wall_time for e in accumulator.Scalars("x")][2:] == [1010.0, 1100.0]


def test_a_partial_file_of_a_killed_writer_is_not_read(tmp_path):
    folder = tmp_path / "tb"
    write_scalars(folder, 0, {"x": 1.0})
    # what a SIGKILL between write and rename leaves: the temporary name, which TensorBoard does not list
    (folder / ".partial-0000000001-999").write_bytes((folder / event_file_name(0)).read_bytes()[:20])
    assert read_events(folder) == {"x": [(0, 1.0)]}


def test_rebuild_writes_every_committed_iteration_from_the_lake(tmp_path):
    lake, written = _lake_with_metrics(tmp_path, "run-b", 5)
    rows = [{"run_id": "run-b", "iteration": 5, "name": "x", "value": 1.0}]
    lake.write_rows("metrics", "run-b", 5, rows, stage="commit")  # published, but iteration 5 was never committed
    paths = rebuild_tensorboard(lake, "run-b")
    assert [p.name for p in paths] == [event_file_name(i) for i in range(5)]
    expected = duckdb_metrics(lake.root, "run-b")
    del expected["x"]
    assert read_events(lake.tensorboard_dir("run-b")) == expected
    with pytest.raises(LakeError, match="no committed iterations.*ragen runs"):
        rebuild_tensorboard(lake, "nope")


def test_an_unwritable_folder_warns_and_does_not_fail_the_commit(tmp_path, caplog):
    lake = DataLake(tmp_path / "lake")
    lake.tensorboard_dir("run-c").parent.mkdir(parents=True)
    lake.tensorboard_dir("run-c").write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger="ragen.monitor"):
        assert record_iteration(lake, "run-c", 0, {"x": 1.0}) is None
    assert "TensorBoard events not written" in caplog.text


@pytest.mark.parametrize(
    ("step", "scalars", "message"),
    [(-1, {"x": 1.0}, "non-negative int"), (1.5, {"x": 1.0}, "non-negative int"), (0, {"": 1.0}, "non-empty")],
)
def test_bad_input_is_refused_before_writing(tmp_path, step, scalars, message):
    with pytest.raises(ValueError, match=message):
        write_scalars(tmp_path / "tb", step, scalars)
    assert not (tmp_path / "tb").exists()
