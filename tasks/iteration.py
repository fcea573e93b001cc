"""An iteration's steps as Prefect tasks: one wrapper for every row of the run layer's tables.

The flows walk a table (:func:`ragen_core.run.iteration.run_iteration`) with ``call=call_as_task``: each step runs as
a task named as its function (``generate_rollouts``), its runs named after the stage and iteration (``generate-i3``,
:func:`ragen_core.run.clock.run_name`), as Prefect's UI shows them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from ragen_core.run.clock import run_name
from ragen_core.run.iteration import IterationState, Step
from ragen_core.run.session import RunSession


@cache
def step_task(step: Step) -> Task[..., Any]:
    """``step``'s function as a Prefect task (made once per step). Never cached by its inputs: the steps share the
    in-memory session, and the lake's commit markers say what is done."""
    return task(step.function, name=step.function.__name__, task_run_name=run_name(step.stage), cache_policy=NO_CACHE)


def call_as_task(step: Step, session: RunSession, iteration: int, state: IterationState) -> object:
    """Run ``step`` as its Prefect task. The session and the state go in quoted: Prefect then neither walks them for
    futures nor records them as the task's inputs (they hold the rollout records and the run's whole metric history,
    which would cost more on every call: benchmarks/RESULTS.md, section 3)."""
    return step_task(step)(quote(session), iteration, quote(state))
