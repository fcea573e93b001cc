"""The re-stamp's comparison of two lakes when the new code stores more (issue 66: the trajectories' end_reason and
final_state): a column only the new lake holds is listed and not compared, every column of the old lake is still
compared bit for bit, and a column the new lake dropped stays an error. Old lakes are read by today's code, whose
queries give a column added since as nulls: the old lake is compared on the columns its files store."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ragen_core.findings.bitwise import ComparisonError, compare_lakes, compare_tables, stored_columns
from ragen_core.storage import DataLake
from schemas.tables import TABLES, TRAJECTORIES, TableSpec
from tests.storage.synthetic import make_run, write_run

KEY = ("k",)


def _table(values: list[float], **extra: list) -> pa.Table:
    return pa.table({"k": list(range(len(values))), "value": pa.array(values, pa.float64()), **extra})


def test_a_column_only_the_new_lake_holds_is_listed_and_the_old_ones_still_compared_bitwise():
    old = _table([0.5, 1.5])
    new = _table([0.5, 1.5], end_reason=["success", "hole"])
    diff = compare_tables("trajectories", old, new, KEY)
    assert diff.equal and diff.new_columns == ["end_reason"]
    assert diff.summary() == "trajectories: 2 rows equal (new columns, not compared: end_reason)"
    moved = _table([0.5, float(np.nextafter(1.5, 2.0))], end_reason=["success", "hole"])  # one ULP off
    diff = compare_tables("trajectories", old, moved, KEY)
    assert not diff.equal and diff.differing_cells == 1 and diff.cells[0][:2] == ((1,), "value")


def test_a_column_the_new_lake_dropped_is_an_error():
    with pytest.raises(ComparisonError, match=r"trajectories: the new lake lacks the old lake's columns \['value'\]"):
        compare_tables("trajectories", _table([0.5]), pa.table({"k": [0]}), KEY)


def _before_end_reasons() -> TableSpec:
    """The trajectories table as the code before end_reason and final_state wrote it (schema version 2)."""
    return TableSpec("trajectories", TRAJECTORIES.columns_at(2), TRAJECTORIES.key, 2, TRAJECTORIES.description)


def test_an_old_lake_compares_on_the_columns_it_stored(tmp_path):
    run = make_run(3, "r", "bandit", iterations=1, groups=2, group_size=2)
    old = DataLake(tmp_path / "old", tables={**TABLES, "trajectories": _before_end_reasons()})
    write_run(old, run)
    new = DataLake(tmp_path / "new")
    write_run(new, run)
    before = set(TRAJECTORIES.arrow_schema_at(2).names)
    assert stored_columns(old.root, "trajectories") == before  # a query gives the current columns (nulls) ...
    assert stored_columns(new.root, "trajectories") == before | {"end_reason", "final_state"}
    diffs = {d.table: d for d in compare_lakes(old.root, new.root)}
    assert all(d.equal for d in diffs.values()), [d.summary() for d in diffs.values()]
    assert diffs["trajectories"].new_columns == ["end_reason", "final_state"]  # ... listed, not compared
    assert diffs["trajectories"].old_rows == len(run.trajectories)
    assert not any(d.new_columns for name, d in diffs.items() if name != "trajectories")
    with pytest.raises(ComparisonError, match=r"lacks the old lake's columns \['end_reason', 'final_state'\]"):
        compare_lakes(new.root, old.root)  # the other way round, the new lake's columns were dropped


def _calls(seconds: float, result: str = "3") -> pa.Table:
    call = {"name": "calculate", "arguments": "{}", "result": result, "error": None, "duration_s": seconds}
    kind = pa.list_(pa.struct([(f, pa.float64() if f == "duration_s" else pa.string()) for f in call]))
    return pa.table({"k": [0, 1], "tool_calls": pa.array([[call], None], kind)})


def test_a_tool_s_seconds_are_timing_and_every_other_field_of_its_call_is_compared():
    skip = ("tool_calls.duration_s",)
    diff = compare_tables("turns", _calls(0.01), _calls(0.02), KEY, skip)
    assert diff.equal and diff.table == "turns"  # the table keeps its name whatever the timing columns are
    assert diff.summary().startswith("turns: 2 rows equal")
    diff = compare_tables("turns", _calls(0.01), _calls(0.01, result="4"), KEY, skip)
    assert not diff.equal and diff.differing_cells == 1 and diff.cells[0][:2] == ((0,), "tool_calls")
    assert not compare_tables("turns", _calls(0.01), _calls(0.02), KEY).equal  # not skipped: seconds differ
