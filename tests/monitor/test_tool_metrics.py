"""A tool env's metrics and events from its turns' tool_calls, counted by hand; none for envs without tools."""

from __future__ import annotations

import pyarrow as pa

from ragen_core.monitor.metrics import tool_failure_events, tool_use
from schemas.tables import TURNS


def _call(name, error=None):
    return {"name": name, "arguments": "{}", "result": "r", "error": error, "duration_s": 0.0}


def _turns(per_turn):
    field = TURNS.arrow_schema.field("tool_calls")
    return pa.table({"tool_calls": pa.array(per_turn, field.type)})


def test_calls_errors_and_failures_per_tool():
    turns = _turns(
        [
            [_call("calculate"), _call("calculate", "raised")],
            [_call(None, "bad_json")],
            [],
            [_call("answer", "timeout"), _call("calculate", "raised"), _call("answer", "not_run")],
        ]
    )
    # 6 calls over 4 turns; 5 with an error; calculate failed twice, answer once (the not_run call is no failure)
    assert tool_use(turns, "rollout") == {
        "rollout/tool_calls": 6 / 4,
        "rollout/tool_error_rate": 5 / 6,
        "rollout/tool_failures/calculate": 2.0,
        "rollout/tool_failures/answer": 1.0,
    }


def test_envs_without_tools_have_none():
    assert tool_use(_turns([None, None]), "rollout") == {}
    assert tool_use(pa.table({"valid": [True]}), "rollout") == {}


def test_each_failing_tool_is_one_event_naming_it():
    metrics = {"rollout/tool_failures/calculate": 2.0, "val/calculator/tool_failures/answer": 1.0, "rollout/x": 3.0}
    events = tool_failure_events(metrics)
    assert [(metric, value) for metric, value, _ in events] == [
        ("rollout/tool_failures/calculate", 2.0),
        ("val/calculator/tool_failures/answer", 1.0),
    ]
    assert events[0][2].startswith(
        "2 call(s) of the tool calculate raised or ran past env.tool_timeout_s in the training"
    )
    assert "in the validation (val/calculator) rollouts" in events[1][2]


def test_turns_that_called_nothing_have_no_error_rate():
    # a policy that never wrote a call (the tiny model before it learns the format): 0 calls per turn, and no share
    # of errors among no calls (a NaN would fail the metrics table's contract)
    assert tool_use(_turns([[], []]), "rollout") == {"rollout/tool_calls": 0.0}


def test_the_event_s_query_quotes_the_tool_s_name():
    (event,) = tool_failure_events({"rollout/tool_failures/it's": 1.0})
    assert "WHERE c.name = 'it''s' AND c.error IN ('raised', 'timeout')" in event[2]
