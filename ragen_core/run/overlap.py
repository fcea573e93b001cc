"""The iterations of a run as its schedule runs them: in table order (synchronous), or overlapped.

:func:`run_iterations` is the one runner of a training run's iterations; the session's schedule
(:class:`ragen_core.run.schedule.Schedule`) says which loop. Asynchronous StarPO (an overlapped schedule, k >= 1):
the sampler and the learner overlap on a fixed schedule. Batch i is sampled by the policy after update i - k (the
start policy for the first k batches: :func:`ragen_core.run.schedule.sampling_version`), so in step n of the run both
sides hold policy version n::

    learner lane:  [evaluate n] -> update n (trains on batch n, sampled by version n - k)  --.
                                                                                              +-> hand-off -> commit n
    sampler lane:  generate -> persist -> validate -> filter of batch n + k (version n)   --'

The two lanes run at the same time (the sampler lane in a thread of this process, which drives the sampler: a
process of its own for the Hugging Face backend, :mod:`ragen_core.rollout.sampler`, or the vLLM rollout server). Each
lane is the rows of the iteration's table that name it (:meth:`~ragen_core.run.schedule.Schedule.lanes`: derived, so
a new stage runs in both schedules), called through the same ``call`` (Prefect tasks in the flows, so a flow run's
timeline shows ``generate-i<n+k>`` beside ``update-i<n>``). At the hand-off the sampler takes version n + 1; nothing
it samples depends on timing, so an async run is as deterministic as a synchronous one.

Two rules make an async run resume exactly:

- the commit of step n waits for batch n + k to be published, so once iteration c is committed every batch up to
  c + k is in the lake. A resume restores version c + 1 (checkpoint and replay), keeps the published batches
  c + 1 .. c + k and uses them (their policies are gone: they are never regenerated,
  :meth:`ragen_core.run.schedule.Schedule.batches_ahead`), and samples batch c + 1 + k with the restored version, as
  the run that never stopped did;
- a batch's metrics (``rollout/*``, ``filter/*``) are read back from its done marker at the commit of its iteration,
  whether this process or an earlier attempt made it.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragen_core.faults import maybe_fail
from ragen_core.run.iteration import Call, IterationState, Step, direct, run_iteration
from ragen_core.run.schedule import Lane
from ragen_core.run.stages import ITERATION, stop_early
from ragen_core.storage import Stage

if TYPE_CHECKING:
    from ragen_core.run.session import RunSession

Committed = Callable[[int, dict[str, float]], None]
Rows = tuple[Step, ...]


class MissingBatchError(RuntimeError):
    """An async run lacks a training batch that only an older policy than the restored one could sample."""


def run_iterations(
    session: RunSession, first: int, call: Call = direct, committed: Committed | None = None, table: Rows = ITERATION
) -> int:
    """The training iterations ``first`` .. ``trainer.iterations - 1`` of ``table``'s rows, each through ``call``, as
    the session's schedule runs them (:func:`synchronous_iterations` or :func:`overlapped_iterations`);
    ``committed(iteration, metrics)`` hears of each commit. Returns the iteration the final validation is committed
    as (earlier when :func:`~ragen_core.run.stages.stop_early` says so)."""
    loop = overlapped_iterations if session.schedule.overlapped else synchronous_iterations
    return loop(session, first, call, committed, table)


def synchronous_iterations(
    session: RunSession, first: int, call: Call = direct, committed: Committed | None = None, table: Rows = ITERATION
) -> int:
    """Each iteration's rows in table order, one iteration after the other from ``first``."""
    for iteration in range(first, session.config.trainer.iterations):
        if stop_early(session, iteration):  # filter_empty_stop_steps: the final validation comes here
            return iteration
        metrics = run_iteration(session, iteration, table, call=call)
        if committed is not None:
            committed(iteration, metrics)
    return session.config.trainer.iterations


def hand_off(session: RunSession, iteration: int, state: IterationState) -> None:
    """Step ``iteration``'s hand-off, after its update: the sampler takes the policy after ``iteration + 1``
    updates (:func:`load_sampler`)."""
    load_sampler(session)
    maybe_fail("handoff", "after", iteration)  # the sampler holds the new weights; the next batch has not started


def load_sampler(session: RunSession) -> None:
    """The sampler takes the learner's current weights: the updater brings the rollout side to them (a launched
    group's rollout copy, a vLLM server), then a training sampler of its own takes them (the sampler process's copy,
    written through shared memory)."""
    session.updater.sync(session.policy)
    session.policy.hand_off()


HAND_OFF = Step("handoff", hand_off, lane=Lane.COMMIT)


@dataclass(frozen=True)
class Lanes:
    """An overlapped step's rows, derived from the iteration's table: the sampler's, the learner's, and the hand-off
    then the commit's."""

    sampler: tuple[Step, ...]
    learner: tuple[Step, ...]
    commit: tuple[Step, ...]

    @classmethod
    def of(cls, session: RunSession, table: Rows) -> Lanes:
        """The lanes of ``table`` under the session's schedule."""
        lanes = session.schedule.lanes(table)
        return cls(lanes[Lane.SAMPLER], lanes[Lane.LEARNER], (HAND_OFF, *lanes[Lane.COMMIT]))


def overlapped_iterations(
    session: RunSession, first: int, call: Call = direct, committed: Committed | None = None, table: Rows = ITERATION
) -> int:
    """Steps ``first`` .. ``trainer.iterations - 1`` of an async run, each lane's rows of ``table`` through
    ``call``."""
    lanes = Lanes.of(session, table)
    load_sampler(session)  # the start (or restored) weights
    timings = _first_batches(session, first, call, lanes)  # time/* of the batches this process sampled, by iteration
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragen-sampler") as lane:
        for n in range(first, session.config.trainer.iterations):
            if stop_early(session, n):
                session.lake.discard_uncommitted(session.run_id, n, keep={})  # batches sampled ahead, never trained
                return n
            metrics = _step(session, n, call, lane, timings, lanes)
            if committed is not None:
                committed(n, metrics)
    return session.config.trainer.iterations


def _first_batches(session: RunSession, first: int, call: Call, lanes: Lanes) -> dict[int, dict[str, float]]:
    """Before step ``first``: the batches of ``first`` .. ``first + k - 1`` that are not published, sampled by the
    start policy (a fresh run's first k); a resume finds them published (kept) and a missing one is refused.
    Returns their metrics, by iteration."""
    schedule, last = session.schedule, session.config.trainer.iterations
    timings = {}
    for j in range(first, min(first + schedule.staleness, last)):
        if _batch_metrics(session, j) is not None:
            continue
        if schedule.sampling_version(j) != first:
            raise MissingBatchError(
                f"run {session.run_id!r} has no published training batch for iteration {j}, which the policy after "
                f"update {schedule.sampling_version(j)} samples (trainer.max_staleness={schedule.staleness}); that "
                "policy is gone, so the batch cannot be made again. Start a new run from the last checkpoint instead"
            )
        timings[j] = run_iteration(session, j, lanes.sampler, call)
    return timings


def _step(
    session: RunSession,
    n: int,
    call: Call,
    lane: ThreadPoolExecutor,
    timings: dict[int, dict[str, float]],
    lanes: Lanes,
) -> dict[str, float]:
    """Step ``n``: the sampler lane of batch n + k beside the learner lane of n, then the hand-off and the commit of
    n once both ended; the committed metrics."""
    schedule, last = session.schedule, session.config.trainer.iterations
    state = IterationState()
    state.metrics.update(_timings(timings.pop(n, {})))
    ahead = n + schedule.staleness
    future = _start(lane, session, ahead, call, lanes.sampler) if ahead < last else None
    try:
        run_iteration(session, n, lanes.learner, call, state)
    except BaseException:
        _settle(future)  # the lane never writes after the run failed; the learner's failure is the one told
        raise
    learner_end = time.perf_counter()
    sampled = None if future is None else future.result()
    if sampled is not None:
        timings[ahead], sampler_end = sampled
        state.metrics["time/learner_wait"] = max(0.0, sampler_end - learner_end)
        state.metrics["time/sampler_wait"] = max(0.0, learner_end - sampler_end)
    stored = _batch_metrics(session, n)
    if stored is None:
        raise MissingBatchError(f"run {session.run_id!r}: iteration {n}'s training batch is not published")
    state.metrics.update(stored)
    state.metrics["rollout/staleness"] = float(n - schedule.sampling_version(n))
    run_iteration(session, n, lanes.commit, call, state)
    return state.metrics


def _start(
    lane: ThreadPoolExecutor, session: RunSession, iteration: int, call: Call, rows: tuple[Step, ...]
) -> Future:
    """The sampler lane's ``rows`` of batch ``iteration``, in the lane's thread, in a copy of this context (a flow
    run's context: its rows become the flow's task runs). Its result: (its time/* metrics, when it ended)."""

    def sample() -> tuple[dict[str, float], float]:
        metrics = run_iteration(session, iteration, rows, call)
        return metrics, time.perf_counter()

    return lane.submit(contextvars.copy_context().run, sample)


def _settle(future: Future | None) -> None:
    """Wait for the sampler lane to end, its own failure dropped (the caller raises the learner's)."""
    if future is not None:
        concurrent.futures.wait([future])


def _timings(metrics: dict[str, float]) -> dict[str, float]:
    """The stage timings of a sampled batch (its other metrics come from its done marker)."""
    return {name: value for name, value in metrics.items() if name.startswith("time/")}


def _batch_metrics(session: RunSession, iteration: int) -> dict[str, float] | None:
    """The stored metrics of ``iteration``'s published training batch, or None when it is not published."""
    done = session.lake.stage_result(session.run_id, iteration, Stage.ROLLOUT)
    return None if done is None else dict(done.get("metrics", {}))
