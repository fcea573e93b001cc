"""The one wrapper that makes each step of an iteration's table a Prefect task (:mod:`tasks.iteration`): a stage
planted as one function and one row runs as a task named as its function, its run named ``<stage>-i<n>``, with the
session and the state handed over as they are, timed by the table's runner as any stage (issue 42, section 2); and
the real table run through it trains bitwise the run it trains when called directly (as tests/run calls it)."""

from __future__ import annotations

import pytest
import torch
from prefect import flow
from prefect.context import TaskRunContext

from ragen_core.config import build_config
from ragen_core.run.iteration import Call, IterationState, Step, direct, run_iteration
from ragen_core.run.record import RunRecord
from ragen_core.run.session import RunSession, open_session
from ragen_core.run.stages import FINAL_VALIDATION, ITERATION
from ragen_core.storage import DataLake, query
from tasks.iteration import call_as_task, step_task
from tests.run.test_iteration import SMALL

seen: list[dict] = []


def planted_count(session, iteration, state):
    """A planted stage: says which task run it ran in and what it was handed."""
    context = TaskRunContext.get()
    seen.append({"task": context.task.name, "run": context.task_run.name, "session": session, "state": state})
    state.metrics["planted/count"] = float(len(seen))
    return "planted result"


def later(session, iteration, state):
    """A second row, to show the state reaches the next task."""
    seen.append({"task": TaskRunContext.get().task.name, "count": state.metrics["planted/count"]})


TABLE = (Step("planted", planted_count), Step("later", later))


@flow
def _iteration(session: RunSession, iteration: int) -> tuple[dict[str, float], IterationState]:
    state = IterationState()
    return run_iteration(session, iteration, TABLE, call=call_as_task, state=state), state


@pytest.fixture
def session(tmp_path) -> RunSession:
    record = RunRecord(DataLake(tmp_path), "planted", {"run_id": "planted", "status": "running"})
    return RunSession(build_config({}), record.lake, "planted", policy=None, updater=None, record=record)


def test_a_planted_stage_runs_as_a_task_named_by_its_function_and_its_row(prefect_harness, session):
    seen.clear()
    metrics, state = _iteration(session, 3)
    assert [(s["task"], s.get("run")) for s in seen] == [("planted_count", "planted-i3"), ("later", None)]
    assert seen[0]["session"] is session and seen[0]["state"] is state  # handed over as they are, not copied
    assert seen[1]["count"] == 1.0  # what the first task put into the state, the second read
    assert sorted(metrics) == ["planted/count", "time/later", "time/planted"]
    assert session.record.position == {"iteration": 3, "stage": "later"}


def test_a_step_s_task_is_made_once_and_returns_its_function_s_result(prefect_harness, session):
    assert step_task(TABLE[0]) is step_task(TABLE[0])
    assert step_task(TABLE[0]).name == "planted_count" and step_task(TABLE[1]).name == "later"

    @flow
    def one_call() -> object:
        return call_as_task(TABLE[0], session, 0, IterationState())

    assert one_call() == "planted result"


def _train(root, model_dir, call: Call) -> dict[str, torch.Tensor]:
    """Two iterations and the final validation of a tiny run, each step through ``call``; the trained weights."""
    config = build_config({**SMALL, "model": {"path": str(model_dir)}})
    session = open_session(config, DataLake(root), "same", model_dir)
    try:
        for iteration in range(2):
            run_iteration(session, iteration, ITERATION, call=call)
        run_iteration(session, 2, FINAL_VALIDATION, call=call)
        return {name: p.detach().clone() for name, p in session.updater.actor.module.named_parameters()}
    finally:
        session.close()


def _rows(root) -> dict[str, list[dict]]:
    return {
        "trajectories": query(root, "SELECT * FROM trajectories ORDER BY ALL").to_pylist(),
        "metrics": query(
            root,
            "SELECT iteration, name, value FROM metrics "
            "WHERE split_part(name, '/', 1) NOT IN ('time', 'perf') ORDER BY ALL",
        ).to_pylist(),
    }


def test_the_table_through_prefect_trains_bitwise_the_run_it_trains_directly(
    prefect_harness, tmp_path, tiny_model_dir
):
    weights: dict[str, dict[str, torch.Tensor]] = {}

    @flow
    def through_prefect() -> None:
        weights["prefect"] = _train(tmp_path / "prefect", tiny_model_dir, call_as_task)

    through_prefect()
    weights["direct"] = _train(tmp_path / "direct", tiny_model_dir, direct)
    assert _rows(tmp_path / "prefect") == _rows(tmp_path / "direct")
    assert len(_rows(tmp_path / "direct")["trajectories"]) == 2 * 8 + 2 * 2  # 2 x (2 groups x 4); validated at 0, 2
    assert weights["prefect"].keys() == weights["direct"].keys()
    assert all(torch.equal(weights["prefect"][name], weights["direct"][name]) for name in weights["direct"])
