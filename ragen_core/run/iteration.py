"""One iteration as a table: each :class:`Step` is a stage's name, its function and when it runs (Prefect-free).

The tables themselves are :data:`ragen_core.run.stages.ITERATION` and ``FINAL_VALIDATION``, beside the functions
their rows name. :func:`run_iteration` walks a table: each step that is due runs under the stage clock (its
``time/<stage>``, and the manifest's position if it fails) through ``call``, which calls the function here
(:func:`direct`, the runs of tests/run) or as a Prefect task (``tasks.iteration.call_as_task``, the flows). A stage is
therefore one function over ``(session, iteration, state)`` and one row; the steps hand each other what they make
through the :class:`IterationState`. A row of the iteration's table also says its lane (:class:`~ragen_core.run.
schedule.Lane`), from which an async run's lanes are derived (:meth:`ragen_core.run.schedule.Schedule.lanes`), or
why an async run cannot run it (:class:`~ragen_core.run.schedule.SyncOnly`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ragen_core.rollout import TrajectoryRecord
from ragen_core.run.batches import BatchPipeline
from ragen_core.run.clock import StageClock
from ragen_core.run.schedule import Lane, SyncOnly

if TYPE_CHECKING:  # the session holds its schedule, whose runner walks these rows
    from ragen_core.run.session import RunSession


@dataclass
class IterationState:
    """What an iteration's steps hand on to the later ones."""

    metrics: dict[str, float] = field(default_factory=dict)  # the iteration's metrics, the commit step stores them
    updated: bool = False  # an update ran (the commit saves a checkpoint when due; the final validation has none)
    tell: Callable[[str], None] | None = None  # hears of each validation env as it starts and ends
    records: list[TrajectoryRecord] = field(default_factory=list)  # the training rollouts: generate -> persist
    batch: BatchPipeline | None = None  # the training batch: persist -> validate -> filter


StepFunction = Callable[["RunSession", int, IterationState], object]
Due = Callable[["RunSession", int, IterationState], bool]


def always(session: RunSession, iteration: int, state: IterationState) -> bool:
    """A step that runs in every iteration."""
    return True


@dataclass(frozen=True)
class Step:
    """One row of an iteration's table: the stage's one name (the clock's ``time/<stage>``, the manifest's position
    of a failed run, the task run ``<stage>-i<n>``), its function (a Prefect task is named as it), when it runs, its
    lane in an async run (the iteration's rows each name one) and, for a row an async run cannot run, why."""

    stage: str
    function: StepFunction
    when: Due = always
    lane: Lane | None = None
    sync_only: SyncOnly | None = None


Call = Callable[[Step, "RunSession", int, IterationState], object]


def direct(step: Step, session: RunSession, iteration: int, state: IterationState) -> object:
    """Call the step's function in this process, as it is."""
    return step.function(session, iteration, state)


def run_iteration(
    session: RunSession,
    iteration: int,
    steps: tuple[Step, ...],
    call: Call = direct,
    state: IterationState | None = None,
) -> dict[str, float]:
    """Run each due step of ``steps`` in order through ``call``, timed under its stage; the iteration's metrics."""
    state = IterationState() if state is None else state
    clock = StageClock(session.record, iteration, state.metrics)
    for step in steps:
        if step.when(session, iteration, state):
            with clock(step.stage):
                call(step, session, iteration, state)
    return state.metrics
