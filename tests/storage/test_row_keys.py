"""Every row counts once, by its key (issue 66, B; :mod:`ragen_core.storage.keys`): the lake's readers refuse a
partition in which two rows share their table's key, naming the files, and read parts whose keys are only
interleaved as usual. Rows are written through the lake's own write path; the expected values are the rows given."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragen_core.storage import DataLake, LakeError, query
from ragen_core.storage.keys import key_bounds, may_share, overlapping
from schemas.tables import METRICS

RUN = "keys"


def _metrics(names: list[str], iteration: int = 0) -> list[dict]:
    return [{"run_id": RUN, "iteration": iteration, "name": n, "value": float(i)} for i, n in enumerate(names)]


def _write(lake: DataLake, *parts: list[str]) -> list[Path]:
    """One published metrics part per list of names, all in the partition (RUN, 0); their paths."""
    return [
        lake.write_rows("metrics", RUN, 0, _metrics(names), stage="commit", part=k) for k, names in enumerate(parts)
    ]


def _count(lake: DataLake) -> int:
    return query(lake, "SELECT count(*) AS n FROM metrics").to_pylist()[0]["n"]


def test_parts_whose_key_ranges_overlap_but_whose_keys_differ_are_read_whole(tmp_path):
    lake = DataLake(tmp_path)
    files = _write(lake, ["a", "c", "e"], ["b", "d"])  # a..e and b..d overlap: the keys themselves are read
    assert overlapping({f: key_bounds(METRICS, pq.read_metadata(f)) for f in files}) == sorted(files)
    assert _count(lake) == 5
    assert sorted(lake.read_table("metrics", RUN)["name"].to_pylist()) == ["a", "b", "c", "d", "e"]


def test_a_key_held_by_two_parts_fails_every_reader_naming_both(tmp_path):
    lake = DataLake(tmp_path)
    first, second = _write(lake, ["a", "c"], ["c", "d"])  # each part passes the contracts alone
    lake.write_rows("metrics", "other", 0, [{**_metrics(["c"])[0], "run_id": "other"}], stage="commit")
    for read in (lambda: _count(lake), lambda: lake.read_table("metrics"), lambda: lake.read_table("metrics", RUN)):
        with pytest.raises(LakeError) as refused:  # the views say it as a LakeError
            read()
        message = str(refused.value)
        assert str(first) in message and str(second) in message and "\n" not in message
        assert "1 key(s) of (run_id, iteration, name) held by more than one row, e.g. ('keys', 0, 'c')" in message
    assert query(lake, "SELECT count(*) AS n FROM metrics", run_id="other").to_pylist() == [{"n": 1}]
    second.unlink()
    assert _count(lake) == 3  # a, c and the other run's c


def test_a_part_that_repeats_a_key_of_its_own_rows_fails_the_python_readers(tmp_path):
    """The lake never writes one (the contracts refuse such a batch): staged and published here by hand."""
    lake = DataLake(tmp_path)
    rows = pa.Table.from_pylist(_metrics(["a", "a"]), schema=METRICS.arrow_schema)
    lake.stage_table(RUN, 0, "commit", "metrics", rows)
    (published,) = lake.publish(RUN, 0, "commit")
    with pytest.raises(LakeError, match=f"part file '{published}' holds rows of the same key in table 'metrics'"):
        lake.read_table("metrics", RUN)


def test_key_bounds_are_each_key_columns_least_and_greatest_value(tmp_path):
    path = tmp_path / "part.parquet"
    table = pa.Table.from_pylist(_metrics(["m", "b", "x", "k"], iteration=3), schema=METRICS.arrow_schema)
    pq.write_table(table, path, row_group_size=2)  # two row groups: (m, b) and (x, k)
    assert pq.read_metadata(path).num_row_groups == 2
    assert key_bounds(METRICS, pq.read_metadata(path)) == ((RUN, RUN), (3, 3), ("b", "x"))
    pq.write_table(table, path, write_statistics=False)
    assert key_bounds(METRICS, pq.read_metadata(path)) == (None, None, None)
    pq.write_table(table.slice(0, 0), path)
    assert key_bounds(METRICS, pq.read_metadata(path)) == ()  # no row: shares no key


def test_two_files_may_share_a_key_only_when_every_key_column_overlaps():
    train, val = (("r", "r"), (0, 0), ("train", "train")), (("r", "r"), (0, 0), ("val", "val"))
    assert not may_share(train, val)  # a partition's train and validation parts
    assert may_share(train, train)
    assert may_share(train, (("r", "r"), None, ("val", "val"))) is False  # one separating column is enough
    assert may_share(train, (None, None, None))  # no statistics: the keys must be read
    assert not may_share(train, ())  # an empty file
