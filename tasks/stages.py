"""A command's session steps as Prefect tasks: one wrapper for every row of the run layer's table of them
(:data:`ragen_core.run.procedures.SESSION_STEPS`: the start model, the bootstrap, opening, resuming and restoring
the session, the offline re-training's steps).

Each step runs as a task named as its function (``open_session``), its runs named by the row (``skip-i4``,
``epoch-i0``) or after the function. They share the in-memory run session, so they opt out of Prefect's input-hash
caching (the lake's commit markers are the source of truth for what is done). The stages of an iteration are tasks
through the same kind of wrapper (:mod:`tasks.iteration`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from ragen_core.run.procedures import SessionStep


@cache
def session_task(step: SessionStep) -> Task[..., Any]:
    """``step``'s function as a Prefect task (made once per step), never cached by its inputs."""
    return task(step.function, name=step.name, task_run_name=step.run_name, cache_policy=NO_CACHE)


def call_as_session_task(step: SessionStep, *args: Any, **kwargs: Any) -> Any:
    """Run ``step`` as its Prefect task: ``hooks.call_step`` of the flows."""
    return session_task(step)(*args, **kwargs)
