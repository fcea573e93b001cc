"""One iteration as a table, run without Prefect: :func:`ragen_core.run.iteration.run_iteration` walks the rows in
order, runs a row only when it is due, times each under its stage and leaves a failed one as the run's position; the
real table trains a tiny run here; and a stage planted as one function and one row runs, is timed, committed and
named by its row with nothing else changed (its task run name: tests/tasks/test_iteration.py)."""

from __future__ import annotations

import pytest

from ragen_core.config import build_config
from ragen_core.run.iteration import IterationState, Step, run_iteration
from ragen_core.run.record import RunRecord
from ragen_core.run.session import RunSession, open_session
from ragen_core.run.stages import FINAL_VALIDATION, ITERATION
from ragen_core.storage import DataLake, query

RUN = "table"
SMALL = {
    "env": {"name": "bandit", "val_envs": ["bandit"]},
    "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
    "actor": {"mini_batch_size": 8, "micro_batch_size": 4},
    "trainer": {"iterations": 2, "checkpoint_every": 1},
    "eval": {"every": 2, "instances": 2},
}


def _bare_session(tmp_path) -> RunSession:
    """A session with no policy and no updater: enough for steps that only write into their state."""
    record = RunRecord(DataLake(tmp_path), RUN, {"run_id": RUN, "status": "running"})
    return RunSession(build_config({}), record.lake, RUN, policy=None, updater=None, record=record)


def test_the_runner_walks_the_rows_in_order_and_runs_a_row_only_when_due(tmp_path):
    session, heard = _bare_session(tmp_path), []

    def first(session, iteration, state):
        state.records = ["made by first"]
        heard.append(("first", iteration))

    def second(session, iteration, state):
        heard.append(("second", state.records))
        state.metrics["second/value"] = 2.0

    def odd(session, iteration, state):
        return iteration % 2 == 1

    table = (Step("one", first), Step("two", second, when=odd), Step("three", first))
    calls = []

    def call(step, session, iteration, state):  # what the flows pass: here, a recording direct call
        calls.append(step.stage)
        return step.function(session, iteration, state)

    even = run_iteration(session, 4, table, call=call)
    assert calls == ["one", "three"] and heard == [("first", 4), ("first", 4)]
    assert sorted(even) == ["time/one", "time/three"]  # a row not due is neither run nor timed
    odd_metrics = run_iteration(session, 5, table)
    assert heard[2:] == [("first", 5), ("second", ["made by first"]), ("first", 5)]  # the state hands on
    assert sorted(odd_metrics) == ["second/value", "time/one", "time/three", "time/two"]
    assert all(value >= 0 for key, value in odd_metrics.items() if key.startswith("time/"))


def test_a_failing_row_is_where_the_run_stopped_and_the_rows_after_it_never_run(tmp_path):
    session, ran = _bare_session(tmp_path), []

    def fails(session, iteration, state):
        raise RuntimeError("stage broke")

    table = (
        Step("before", lambda s, i, state: ran.append("before")),
        Step("breaks", fails),
        Step("after", lambda s, i, state: ran.append("after")),
    )
    state = IterationState()
    with pytest.raises(RuntimeError, match="stage broke"):
        run_iteration(session, 7, table, state=state)
    assert ran == ["before"] and session.record.position == {"iteration": 7, "stage": "breaks"}
    assert list(state.metrics) == ["time/before"]


def planted_rows(session, iteration, state):
    """A planted stage: the rows the filter kept, read back from the published batch, as a metric."""
    kept = state.batch.checked()[0]["kept"].to_pylist()
    state.metrics["planted/kept_rows"] = float(sum(kept))
    return state.metrics["planted/kept_rows"]


def test_the_real_table_trains_without_prefect_and_a_planted_stage_is_one_function_and_one_row(
    tmp_path, tiny_model_dir
):
    """The iteration's table with one row added before the commit (nothing else changed): two trained iterations
    and the final validation, committed; the planted stage ran after the filter, was timed under its name and its
    metric was committed with the iteration's."""
    at = [step.stage for step in ITERATION].index("commit")
    table = (*ITERATION[:at], Step("planted", planted_rows), *ITERATION[at:])
    config = build_config({**SMALL, "model": {"path": str(tiny_model_dir)}})
    lake = DataLake(tmp_path)
    session = open_session(config, lake, RUN, tiny_model_dir)
    try:
        returned = [run_iteration(session, i, table) for i in range(2)]
        final = run_iteration(session, 2, FINAL_VALIDATION)
    finally:
        session.close()
    assert lake.committed_iterations(RUN) == [0, 1, 2]
    assert [n for n, _ in lake.list_checkpoints(RUN)] == [1, 2]  # checkpoint_every=1: after each update
    timed = [[k.removeprefix("time/") for k in m if k.startswith("time/") and "_" not in k] for m in returned]
    assert timed == [
        ["evaluate", "generate", "persist", "validate", "filter", "update", "planted", "commit"],  # eval.every=2
        ["generate", "persist", "validate", "filter", "update", "planted", "commit"],
    ]
    assert [k for k in final if k.startswith("time/")] == ["time/evaluate", "time/commit"]
    committed = query(
        tmp_path, "SELECT iteration, name, value FROM metrics WHERE name IN ('planted/kept_rows', 'time/planted')"
    ).to_pylist()
    by_name = {(r["iteration"], r["name"]): r["value"] for r in committed}
    kept = query(
        tmp_path, "SELECT iteration, count(*) AS n FROM trajectories WHERE split = 'train' AND kept GROUP BY iteration"
    ).to_pylist()
    assert {(r["iteration"], "planted/kept_rows"): float(r["n"]) for r in kept} == {
        k: v for k, v in by_name.items() if k[1] == "planted/kept_rows"
    }  # the planted metric, committed, counted again from the published rows
    assert {k for k in by_name if k[1] == "time/planted"} == {(0, "time/planted"), (1, "time/planted")}
    assert lake.commit_payload(RUN, 1)["updated"] is True and lake.commit_payload(RUN, 2)["updated"] is False
