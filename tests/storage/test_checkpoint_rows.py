"""The ``checkpoints`` table's ``available`` column (issue 40, section 4 item 4): computed when queried from the
checkpoint folders there are, so a checkpoint that ``trainer.keep_last`` pruned keeps its rows, marked false."""

from __future__ import annotations

from pathlib import Path

from ragen_core.storage import DataLake, Stage, query
from ragen_core.storage.layout import CHECKPOINT_HF, CHECKPOINT_INFO, checkpoint_file
from ragen_core.storage.rows import checkpoint_row


def _save(lake: DataLake, run_id: str, updates: int, complete: bool = True) -> None:
    """A checkpoint folder after ``updates`` updates (with its info file when ``complete``) and its two rows."""
    folder = lake.checkpoint_dir(run_id, updates)
    checkpoint_file(folder, CHECKPOINT_HF).mkdir(parents=True)
    if complete:
        checkpoint_file(folder, CHECKPOINT_INFO).write_text("{}")
    rows = [
        checkpoint_row(run_id, updates - 1, str(folder), "deepspeed", {}),
        checkpoint_row(run_id, updates - 1, str(checkpoint_file(folder, CHECKPOINT_HF)), "hf", {}),
    ]
    lake.write_rows("checkpoints", run_id, updates - 1, rows, stage=Stage.COMMIT)


def _available(root: Path, run_id: str | None = None) -> dict[tuple[str, int, str], bool]:
    rows = query(root, "SELECT run_id, iteration, format, available FROM checkpoints", run_id=run_id).to_pylist()
    return {(r["run_id"], r["iteration"], r["format"]): r["available"] for r in rows}


def test_pruned_checkpoints_keep_their_rows_marked_unavailable(tmp_path):
    lake = DataLake(tmp_path)
    for updates in (1, 2, 3):
        _save(lake, "r", updates)
    _save(lake, "s", 1, complete=False)  # a save cut short: no info file, so no checkpoint
    pruned = lake.prune_checkpoints("r", keep_last=2)
    assert pruned == [lake.checkpoint_dir("r", 1)]  # the premise: the oldest one went
    expected = {("r", 0, f): False for f in ("deepspeed", "hf")}
    expected |= {("r", i, f): True for i in (1, 2) for f in ("deepspeed", "hf")}
    expected |= {("s", 0, f): False for f in ("deepspeed", "hf")}
    assert _available(tmp_path) == expected
    assert _available(tmp_path, "r") == {k: v for k, v in expected.items() if k[0] == "r"}
    columns = query(tmp_path, "DESCRIBE checkpoints").to_pylist()
    assert [(c["column_name"], c["column_type"]) for c in columns][-2:] == [
        ("created_at", "TIMESTAMP WITH TIME ZONE"),
        ("available", "BOOLEAN"),
    ]


def test_a_data_root_without_checkpoints_has_the_column_too(tmp_path):
    assert query(tmp_path, "SELECT count(*) AS n, count(available) AS a FROM checkpoints").to_pylist() == [
        {"n": 0, "a": 0}
    ]
