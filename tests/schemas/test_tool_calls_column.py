"""The turns table's tool_calls (schema version 2): its type, its description of every error, and older lakes read
it as null, next to new rows that hold calls."""

from __future__ import annotations

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, turns_table
from ragen_core.storage import DataLake, query
from ragen_core.tools import TOOL_ERRORS
from schemas.tables import TABLES, TURNS, TableSpec


def test_the_column_describes_every_error_and_was_added_in_version_2():
    column = TURNS.column("tool_calls")
    assert TURNS.version == 2 and column.added_in == 2 and column.nullable
    assert [f.name for f in column.type.value_type] == ["name", "arguments", "result", "error", "duration_s"]
    for error in TOOL_ERRORS:
        assert f"'{error}'" in column.description, error


def test_older_lakes_read_it_as_null_next_to_new_rows(tiny_policy, tmp_path):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec("calculator", [1], 2, 4, 1, 4, enable_think=False)
    records = run_rollouts(spec, ScriptedBackend("expert", tokenizer), ChatFormatter(tokenizer), seed=0)
    table = turns_table(records, BatchMeta.training("new", 0, 1.0, "h"))
    lake = DataLake(tmp_path)
    lake.write_rows("turns", "new", 0, table, stage="rollout")
    before = TableSpec("turns", TURNS.columns_at(1), TURNS.key, 1, TURNS.description)
    old = DataLake(tmp_path, tables={**TABLES, "turns": before})  # the code before the column existed
    old.write_rows(
        "turns",
        "old",
        0,
        [{**r, "run_id": "old"} for r in table.drop_columns(["tool_calls"]).to_pylist()],
        stage="rollout",
    )
    found = query(tmp_path, "SELECT run_id, tool_calls FROM turns ORDER BY run_id, traj_index, turn_index").to_pylist()
    new = [r for r in found if r["run_id"] == "new"]
    assert [r["tool_calls"] for r in new] == [t.tool_calls for r in records for t in r.turns]
    assert all(r["tool_calls"] is None for r in found if r["run_id"] == "old") and len(found) == 2 * len(new)
    assert lake.read_table("turns", "old").column("tool_calls").null_count == len(new)
