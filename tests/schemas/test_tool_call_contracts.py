"""The data contracts of the turns' tool_calls: a calculator batch passes, and each way a record can break the
column's rules is caught, the same rows, by both implementations (the vectorised checks and the library reference);
the rule itself is checked by hand on single turns."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from schemas.contracts import validate_trajectory_batch
from schemas.suites import tool_calls_problem

GROUP_SIZE = 2


@pytest.fixture(scope="module")
def calculator_batch(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("calculator", [3, 4], GROUP_SIZE, 4, 2, 4, enable_think=False)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    meta = BatchMeta(run_id="r", iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="h")
    return trajectories_table(records, meta), turns_table(records, meta)


def _checks(trajectories, turns) -> list[str]:
    vectorised, libraries = (
        validate_trajectory_batch(trajectories, turns, GROUP_SIZE, (-1.0, 1.0), engine=engine)
        for engine in ("vectorised", "libraries")
    )
    found = {
        e: {(f["check"], f["column"]): f["rows"] for f in r.failures} for e, r in (("v", vectorised), ("l", libraries))
    }
    assert found["v"] == {k: v for k, v in found["l"].items()}
    return vectorised.failed_checks()


def _edited(turns: pa.Table, row: int, change) -> pa.Table:
    values = turns["tool_calls"].to_pylist()
    values[row] = change([dict(call) for call in values[row]])
    index = turns.schema.get_field_index("tool_calls")
    return turns.set_column(
        index, turns.schema.field("tool_calls"), pa.array(values, turns.schema.field("tool_calls").type)
    )


def _first_ran(turns: pa.Table) -> int:
    return next(i for i, calls in enumerate(turns["tool_calls"].to_pylist()) if calls and calls[0]["error"] is None)


def test_a_calculator_batch_passes(calculator_batch):
    assert _checks(*calculator_batch) == []


def _set(field, value):
    def change(calls):
        calls[0][field] = value
        return calls

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set("error", "exploded"),  # not an error the column names
        _set("name", None),  # a name missing from a call that parsed
        _set("result", None),
        _set("duration_s", -1.0),
        _set("duration_s", math.nan),
        _set("error", "not_run"),  # a call that did not run, yet took time and counts as an action
        lambda calls: [*calls, {**calls[0]}],  # more calls ran than the turn has actions
    ],
)
def test_a_broken_record_is_caught_by_both(calculator_batch, change):
    trajectories, turns = calculator_batch
    assert _checks(trajectories, _edited(turns, _first_ran(turns), change)) == ["tool_calls_consistent"]


def test_the_rule_by_hand():
    ran = {"name": "calculate", "arguments": "{}", "result": "3", "error": None, "duration_s": 0.01}
    unparsed = {"name": None, "arguments": "{", "result": "error: ...", "error": "bad_json", "duration_s": 0.0}
    assert not tool_calls_problem(None, [])  # an env without tools
    assert not tool_calls_problem([], [])
    assert not tool_calls_problem([ran, unparsed], ["x"])
    assert tool_calls_problem([ran], [])  # a call ran, no action recorded
    assert tool_calls_problem([{**unparsed, "duration_s": 0.5}], [])  # it did not run: no time
    assert tool_calls_problem([{**ran, "error": "raised"}, ran], ["x"])  # two ran
