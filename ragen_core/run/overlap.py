"""Asynchronous StarPO (``trainer.max_staleness`` = k >= 1): the sampler and the learner overlap on a fixed schedule.

Batch i is sampled by the policy after update i - k (the start policy for the first k batches:
:func:`ragen_core.run.stages.sampling_version`), so in step n of the run both sides hold policy version n::

    learner lane:  [evaluate n] -> update n (trains on batch n, sampled by version n - k)  --.
                                                                                              +-> hand-off -> commit n
    sampler lane:  generate -> persist -> validate -> filter of batch n + k (version n)   --'

The two lanes run at the same time (the sampler lane in a thread of this process, which drives the sampler: a
process of its own for the Hugging Face backend, :mod:`ragen_core.run.sampler`, or the vLLM rollout server). Each lane
is rows of the iteration's table, called through the same ``call`` (Prefect tasks in the flows, so a flow run's
timeline shows ``generate-i<n+k>`` beside ``update-i<n>``). At the hand-off the sampler takes version n + 1; nothing
it samples depends on timing, so an async run is as deterministic as a synchronous one.

Two rules make an async run resume exactly:

- the commit of step n waits for batch n + k to be published, so once iteration c is committed every batch up to
  c + k is in the lake. A resume restores version c + 1 (checkpoint and replay), keeps the published batches
  c + 1 .. c + k and uses them (their policies are gone: they are never regenerated,
  :func:`ragen_core.run.decisions.batches_ahead`), and samples batch c + 1 + k with the restored version, as the run
  that never stopped did;
- a batch's metrics (``rollout/*``, ``filter/*``) are read back from its done marker at the commit of its iteration,
  whether this process or an earlier attempt made it.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ragen_core.faults import maybe_fail
from ragen_core.run.iteration import Call, IterationState, Step, direct, run_iteration
from ragen_core.run.session import RunSession
from ragen_core.run.stages import (
    COMMIT,
    evaluate,
    evaluation_due,
    filter_and_publish,
    generate_rollouts,
    persist,
    sampling_version,
    stop_early,
    update_policy,
    validate,
)
from ragen_core.storage import Stage


class MissingBatchError(RuntimeError):
    """An async run lacks a training batch that only an older policy than the restored one could sample."""


def hand_off(session: RunSession, iteration: int, state: IterationState) -> None:
    """Step ``iteration``'s hand-off, after its update: the sampler takes the policy after ``iteration + 1``
    updates (:func:`load_sampler`)."""
    load_sampler(session)
    maybe_fail("handoff", "after", iteration)  # the sampler holds the new weights; the next batch has not started


def load_sampler(session: RunSession) -> None:
    """The sampler takes the learner's current weights: the launched group's rollout copy or the vLLM server are
    synced first, then the sampler process's copy is written through shared memory."""
    session.updater.sync(session.policy)
    if session.policy.sampler is not None:
        session.policy.sampler.load(session.policy.model)


# The rows of an async step, in each lane's order (their stages are the iteration table's, plus the hand-off).
SAMPLER_LANE: tuple[Step, ...] = (
    Step("generate", generate_rollouts),
    Step("persist", persist),
    Step("validate", validate),
    Step("filter", filter_and_publish),
)
LEARNER_LANE: tuple[Step, ...] = (
    Step("evaluate", evaluate, when=evaluation_due),
    Step("update", update_policy),
)
HAND_OFF = Step("handoff", hand_off)


def overlapped_iterations(
    session: RunSession,
    first: int,
    call: Call = direct,
    committed: Callable[[int, dict[str, float]], None] | None = None,
) -> int:
    """Steps ``first`` .. ``trainer.iterations - 1`` of an async run, each lane's rows through ``call``;
    ``committed(iteration, metrics)`` hears of each commit. Returns the iteration the final validation is committed
    as (earlier when :func:`~ragen_core.run.stages.stop_early` says so)."""
    load_sampler(session)  # the start (or restored) weights
    timings = _first_batches(session, first, call)  # time/* of the batches this process sampled, by iteration
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragen-sampler") as lane:
        for n in range(first, session.config.trainer.iterations):
            if stop_early(session, n):
                session.lake.discard_uncommitted(session.run_id, n, keep={})  # batches sampled ahead, never trained
                return n
            metrics = _step(session, n, call, lane, timings)
            if committed is not None:
                committed(n, metrics)
    return session.config.trainer.iterations


def _first_batches(session: RunSession, first: int, call: Call) -> dict[int, dict[str, float]]:
    """Before step ``first``: the batches of ``first`` .. ``first + k - 1`` that are not published, sampled by the
    start policy (a fresh run's first k); a resume finds them published (kept) and a missing one is refused.
    Returns their metrics, by iteration."""
    k, last = session.config.trainer.max_staleness, session.config.trainer.iterations
    timings = {}
    for j in range(first, min(first + k, last)):
        if _batch_metrics(session, j) is not None:
            continue
        if sampling_version(j, k) != first:
            raise MissingBatchError(
                f"run {session.run_id!r} has no published training batch for iteration {j}, which the policy after "
                f"update {sampling_version(j, k)} samples (trainer.max_staleness={k}); that policy is gone, so the "
                "batch cannot be made again. Start a new run from the last checkpoint instead"
            )
        timings[j] = run_iteration(session, j, SAMPLER_LANE, call)
    return timings


def _step(
    session: RunSession, n: int, call: Call, lane: ThreadPoolExecutor, timings: dict[int, dict[str, float]]
) -> dict[str, float]:
    """Step ``n``: the sampler lane of batch n + k beside the learner lane of n, then the hand-off and the commit of
    n once both ended; the committed metrics."""
    k, last = session.config.trainer.max_staleness, session.config.trainer.iterations
    state = IterationState()
    state.metrics.update(_timings(timings.pop(n, {})))
    ahead = n + k
    future = _start(lane, session, ahead, call) if ahead < last else None
    try:
        run_iteration(session, n, LEARNER_LANE, call, state)
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
    state.metrics["rollout/staleness"] = float(n - sampling_version(n, k))
    run_iteration(session, n, (HAND_OFF, COMMIT), call, state)
    return state.metrics


def _start(lane: ThreadPoolExecutor, session: RunSession, iteration: int, call: Call) -> Future:
    """The sampler lane of batch ``iteration``, in the lane's thread, in a copy of this context (a flow run's
    context: its rows become the flow's task runs). Its result: (its time/* metrics, when it ended)."""

    def sample() -> tuple[dict[str, float], float]:
        metrics = run_iteration(session, iteration, SAMPLER_LANE, call)
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
