"""Compaction merges a run's part files per (table, iteration); readers see every row exactly once in every state,
including after a crash between any two steps."""

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ragen_core.storage import DataLake, LakeError, query
from ragen_core.storage import trust as layout_module
from ragen_core.storage.locks import run_lock
from ragen_core.storage.maintenance import compact_run
from ragen_core.storage.maintenance import compaction as compaction_module
from ragen_core.storage.parts import COMPACTION_MARKER, merged_name
from schemas.tables import TRAJECTORIES
from tests.storage.synthetic import make_run, write_run

RUN = "run-c"
TABLES = ("trajectories", "turns", "metrics", "evaluations")


@pytest.fixture()
def lake(tmp_path):
    lake = DataLake(tmp_path)
    run = make_run(3, RUN, "sokoban", iterations=2, groups=2, group_size=2)
    write_run(lake, run)
    lake.commit_iteration(RUN, 2, {})  # the final validation iteration is committed too
    return lake


def _snapshot(lake: DataLake) -> dict[str, list[dict]]:
    """Every visible row of every table, through the Python reader and through DuckDB."""
    rows = {table: lake.read_table(table, RUN).to_pylist() for table in TABLES}
    for table in TABLES:
        (count,) = query(lake, f"SELECT count(*) AS n FROM {table}").to_pylist()
        assert count["n"] == len(rows[table]), table
    return rows


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=repr)


def test_compaction_merges_each_partition_into_one_file_with_the_same_rows(lake):
    before = _snapshot(lake)
    parts_before = {i: lake.partition_files("trajectories", RUN, i) for i in range(3)}
    assert [len(parts_before[i]) for i in range(3)] == [2, 2, 1]  # rollout + eval at 0 and 1; only eval at 2

    report = compact_run(lake, RUN)

    assert {(c.table, c.iteration) for c in report.compacted} == {
        ("trajectories", 0),
        ("trajectories", 1),
        ("turns", 0),
        ("turns", 1),
    }
    assert report.files_removed == 4 and report.skipped_uncommitted == []
    for iteration in range(3):
        (merged,) = lake.partition_files("trajectories", RUN, iteration)
        if iteration < 2:
            assert merged.name == merged_name([p.name for p in parts_before[iteration]])
            schema = pq.read_schema(merged)
            assert schema.metadata[b"schema_version"] == str(TRAJECTORIES.version).encode()
            assert schema.metadata[b"table"] == b"trajectories"
            assert schema.field("input_ids").metadata[b"description"].startswith(b"The whole chat")
    after = _snapshot(lake)
    assert after == before  # same rows, same order (the merged file keeps the reader's file order)
    assert compact_run(lake, RUN).compacted == []  # nothing left to merge


def test_uncommitted_iterations_are_left_alone(tmp_path):
    lake = DataLake(tmp_path)
    write_run(lake, make_run(4, RUN, "sokoban", iterations=1, groups=2, group_size=2), commit=False)
    lake.commit_iteration(RUN, 0, {})
    report = compact_run(lake, RUN, ["trajectories"])
    assert [(c.table, c.iteration) for c in report.compacted] == [("trajectories", 0)]
    assert report.skipped_uncommitted == [("trajectories", 1)]
    assert len(lake.partition_files("trajectories", RUN, 1)) == 1  # only its eval part; iteration 1 untouched


def test_crash_before_the_merged_file_appears_leaves_the_old_parts_visible(lake, monkeypatch):
    before = _snapshot(lake)
    folder = lake.partition_dir("trajectories", RUN, 0)
    old = sorted(p.name for p in folder.glob("part-*.parquet"))

    def crash(path, table, *_):  # dies while writing the merged file: only a hidden temporary exists
        (path.parent / f".{path.name}.tmp-999").write_bytes(b"partial")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(compaction_module, "atomic_write_parquet", crash)
    with pytest.raises(KeyboardInterrupt):
        compact_run(lake, RUN, ["trajectories"])
    assert (folder / COMPACTION_MARKER).is_file()  # the marker is on disk but inert: its merged file is absent
    assert sorted(p.name for p in lake.partition_files("trajectories", RUN, 0)) == old
    assert _snapshot(lake) == before

    monkeypatch.undo()
    compact_run(lake, RUN)  # the redo recovers (drops the temporary) and completes
    assert not list(folder.glob(".*tmp-*")) and len(lake.partition_files("trajectories", RUN, 0)) == 1
    assert _snapshot(lake) == before


def test_crash_while_deleting_the_replaced_parts_shows_only_the_merged_file(lake, monkeypatch):
    before = _snapshot(lake)
    folder = lake.partition_dir("turns", RUN, 0)  # the first partition compacted
    real_delete = compaction_module.delete_replaced

    def crash(folder_, names):  # dies after deleting the first replaced file
        real_delete(folder_, names[:1])
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(compaction_module, "delete_replaced", crash)
    with pytest.raises(KeyboardInterrupt):
        compact_run(lake, RUN, ["turns"])
    on_disk = sorted(p.name for p in folder.glob("part-*.parquet"))
    assert len(on_disk) == 2  # the merged file and one replaced part remain
    (visible,) = lake.partition_files("turns", RUN, 0)
    assert visible.name.startswith("part-compacted-")
    assert _sorted(lake.read_table("turns", RUN).to_pylist()) == _sorted(before["turns"])
    (count,) = query(lake, "SELECT count(*) AS n FROM turns").to_pylist()
    assert count["n"] == len(before["turns"])

    monkeypatch.undo()
    compact_run(lake, RUN, ["turns"])  # recovery deletes the leftover part
    assert [p.name for p in folder.glob("part-*.parquet")] == [visible.name]
    assert _sorted(_snapshot(lake)["turns"]) == _sorted(before["turns"])


def test_a_part_published_after_compaction_is_visible_and_merged_next_time(lake):
    compact_run(lake, RUN)
    extra = [{"run_id": RUN, "iteration": 1, "name": "late/metric", "value": 7.0}]
    lake.write_rows("metrics", RUN, 1, extra, stage="late")
    names = {r["name"] for r in lake.read_table("metrics", RUN, 1).to_pylist()}
    assert "late/metric" in names and "time/update" in names
    report = compact_run(lake, RUN, ["metrics"])
    assert [(c.iteration, c.files_before) for c in report.compacted] == [(1, 2)]
    assert {r["name"] for r in lake.read_table("metrics", RUN, 1).to_pylist()} == names


def test_republishing_a_compacted_part_is_refused(lake):
    compact_run(lake, RUN)
    published = lake.read_table("trajectories", RUN, 0)
    rows = published.filter(pc.equal(published["split"], "train"))
    with pytest.raises(LakeError, match="was compacted into"):
        lake.write_rows("trajectories", RUN, 0, rows, stage="rollout")  # part-rollout-00000 is in the merged file


def test_readers_list_again_when_a_compaction_deleted_their_files(lake, monkeypatch):
    before = _snapshot(lake)
    stale = {t: lake.partition_files(t, RUN) for t in TABLES}
    compact_run(lake, RUN)
    real = DataLake.partition_files
    served = set()

    def stale_once(self, table, run_id=None, iteration=None):  # the first listing predates the compaction
        if table in stale and table not in served and iteration is None:
            served.add(table)
            return stale[table]
        return real(self, table, run_id, iteration)

    monkeypatch.setattr(DataLake, "partition_files", stale_once)
    assert lake.read_table("turns", RUN).to_pylist() != [] and "turns" in served
    served.clear()
    (count,) = query(lake, "SELECT count(*) AS n FROM trajectories").to_pylist()
    assert count["n"] == len(before["trajectories"]) and "trajectories" in served


def test_a_replaced_part_deleted_while_a_reader_checks_the_marker_counts_as_absent(lake, monkeypatch):
    """The compaction's last step lands between a reader's listing (merged file and replaced parts) and the footer
    reads of the marker check: the reader sees the merged file, never an error."""
    before = _snapshot(lake)
    real_delete = compaction_module.delete_replaced

    def crash(folder_, names):  # stops after the commit point: the merged file and every replaced part are there
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(compaction_module, "delete_replaced", crash)
    with pytest.raises(KeyboardInterrupt):
        compact_run(lake, RUN, ["turns"])
    monkeypatch.setattr(compaction_module, "delete_replaced", real_delete)
    folder = lake.partition_dir("turns", RUN, 0)
    replaced = {p for p in folder.glob("part-*.parquet") if not p.name.startswith("part-compacted-")}
    assert len(replaced) == 2
    real_footer = layout_module.footer
    deleted = []

    def footer_after_step_4(path):  # the compaction deletes each replaced part just before the reader's look
        if path in replaced and path.exists():
            path.unlink()
            deleted.append(path)
        return real_footer(path)

    monkeypatch.setattr(layout_module, "footer", footer_after_step_4)
    assert _sorted(lake.read_table("turns", RUN).to_pylist()) == _sorted(before["turns"])
    assert deleted and [p.name for p in lake.partition_files("turns", RUN, 0)][0].startswith("part-compacted-")
    (count,) = query(lake, "SELECT count(*) AS n FROM turns").to_pylist()
    assert count["n"] == len(before["turns"]) and set(deleted) == replaced


def test_a_visible_part_deleted_after_the_listing_makes_the_reader_read_its_partition_again(lake, monkeypatch):
    """A reader lists a partition's parts, then a compaction merges and deletes them before the reader opens them:
    the reader lists that partition again and reads it whole from the merged file (Python reader and DuckDB)."""
    before = _snapshot(lake)
    real = DataLake.partition_files
    compacted = set()

    def compacted_after_listing(self, table, run_id=None, iteration=None):
        files = real(self, table, run_id, iteration)
        if iteration is None and table not in compacted:
            compacted.add(table)
            compact_run(lake, RUN, [table])  # every part just listed is gone now
        return files

    monkeypatch.setattr(DataLake, "partition_files", compacted_after_listing)
    assert _sorted(lake.read_table("turns", RUN).to_pylist()) == _sorted(before["turns"])
    (count,) = query(lake, "SELECT count(*) AS n FROM trajectories").to_pylist()
    assert count["n"] == len(before["trajectories"]) and {"turns", "trajectories"} <= compacted
    monkeypatch.undo()
    assert all(p.name.startswith("part-compacted-") for p in lake.partition_files("turns", RUN, 0))


def test_one_housekeeper_per_run(lake):
    with run_lock(lake, RUN):
        with pytest.raises(LakeError, match="being compacted or removed by another process"):
            compact_run(lake, RUN)
    compact_run(lake, RUN)  # the lock is free again
