"""The one wrapper that makes each row of the session steps' table a Prefect task (:mod:`tasks.stages`): a step
planted as one function and one row runs, called by name, as a task named as its function, its run named by the
row's template; called directly it returns the same; a name not in the table is refused; and the table's every row
is a task of the flows through the same wrapper (issue 53, section 2)."""

from __future__ import annotations

import pytest
from prefect import flow
from prefect.context import TaskRunContext

from flows.train import PREFECT
from ragen_core.run.procedures import SESSION_STEPS, Hooks, SessionStep, Steps, call_step
from tasks.stages import call_as_session_task, session_task

seen: list[tuple[str, str]] = []


def warm_cache(name: str, rounds: int) -> str:
    """A planted session step: says which task run it ran in."""
    context = TaskRunContext.get()
    if context is not None:
        seen.append((context.task.name, context.task_run.name))
    return f"{name} x{rounds}"


PLANTED = (*SESSION_STEPS, SessionStep(warm_cache, "warm-{rounds}"))


def test_a_planted_step_is_one_function_and_one_row(prefect_harness):
    seen.clear()

    @flow
    def through_prefect() -> str:
        return Steps(PLANTED, call_as_session_task).warm_cache("lake", rounds=3)

    assert through_prefect() == "lake x3"
    assert seen == [("warm_cache", "warm-3")]
    assert Steps(PLANTED, call_step).warm_cache("lake", 2) == "lake x2" and len(seen) == 1  # directly: no task


def test_a_step_not_in_the_table_is_refused_by_name():
    with pytest.raises(AttributeError, match="no session step 'warm_cache'; the steps: base_model_dir, "):
        _ = Steps(SESSION_STEPS, call_step).warm_cache
    with pytest.raises(ValueError, match="two session steps share a name"):
        Steps((*PLANTED, SessionStep(warm_cache)), call_step)


def test_every_row_is_a_task_of_the_flows_named_as_its_function():
    assert PREFECT.call_step is call_as_session_task and Hooks().call_step is call_step
    for step in SESSION_STEPS:
        made = session_task(step)
        assert made is session_task(step)  # made once
        assert made.name == step.function.__name__ and made.fn is step.function
    names = {step.name: step.run_name for step in SESSION_STEPS}
    assert names["skip_iteration"] == "skip-i{iteration}" and names["offline_epoch"] == "epoch-i{epoch}"
    assert len(names) == len(SESSION_STEPS) == 10
