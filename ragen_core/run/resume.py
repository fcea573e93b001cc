"""Resuming a run from its last committed point (README, "exact resume").

The lake is the source of truth. Iteration i is done when its commit marker exists; its marker is written after its
update, metrics and (when due) checkpoint. A resumed run (the decisions are :mod:`ragen_core.run.decisions`'):

1. refuses a config whose hash differs from the manifest's, unless the differing keys are explicitly allowed;
2. refuses to regenerate a batch that was quarantined (the same seeds would give the same batch) unless told to
   skip that iteration;
3. discards every trace of uncommitted iterations (staging and any partitions already published), which are redone
   from their seeds and so come out identical;
4. loads the newest checkpoint that the committed iterations cover and replays the later committed updates from their
   stored batches (the offline path), which gives the same weights as the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ragen_core.config import RunConfig
from ragen_core.run.decisions import ResumePlan, check_resumable, plan_resume
from ragen_core.run.session import RunSession
from ragen_core.storage import DataLake, Stage, event_row


def prepare_resume(
    lake: DataLake, config: RunConfig, run_id: str, skip_iteration: bool
) -> ResumePlan:
    """The checks of a resume that need the lake (gaps, a quarantined batch), then the plan; the uncommitted output
    of the next iterations is discarded (the finished stages of the next one are kept, to be reused). The config was
    checked against the manifest by :func:`ragen_core.run.decisions.decide_start`, which chose to resume."""
    committed = lake.committed_iterations(run_id)
    skipped = [i for i in committed if lake.commit_payload(run_id, i).get("skipped")]
    quarantine = lake.quarantine_dir(run_id, len(committed), Stage.ROLLOUT)
    quarantined = str(quarantine) if quarantine.is_dir() else None
    plan = plan_resume(run_id, config, committed, skipped, lake.list_checkpoints(run_id), quarantined)
    check_resumable(plan, run_id, skip_iteration)
    reused = lake.discard_uncommitted(run_id, plan.next_iteration)
    return dataclasses.replace(plan, reused_stages=reused)


def restore_session(session: RunSession, plan: ResumePlan) -> dict[str, Any]:
    """Bring a freshly opened session to the state after the committed iterations: the updater loads the checkpoint
    and replays the later committed updates from their stored batches, the rollout side takes the weights, and the
    collapse monitor gets its metric history back."""
    session.updater.restore(plan.checkpoint, plan.replay)
    session.updater.sync(session.policy)
    trained = plan.training_iterations(session.config)
    session.record.metric_history = metric_history(session.lake, session.run_id, trained)
    restored = {
        "checkpoint": str(plan.checkpoint) if plan.checkpoint else None,
        "checkpoint_updates": plan.checkpoint_updates,
        "replayed": plan.replay,
        "next_iteration": plan.next_iteration,
        "reused_stages": plan.reused_stages,
    }
    if session.record.manifest.get("resumes"):
        session.record.manifest["resumes"][-1].update(restored)
        session.record.update()
    return restored


def metric_history(lake: DataLake, run_id: str, iterations: list[int]) -> list[dict[str, float]]:
    """The stored metrics of ``iterations``, one dict per iteration in order (for the collapse monitor)."""
    if not iterations:
        return []
    history: dict[int, dict[str, float]] = {i: {} for i in iterations}
    for row in lake.read_table("metrics", run_id).to_pylist():
        if row["iteration"] in history:
            history[row["iteration"]][row["name"]] = row["value"]
    return [history[i] for i in iterations]


def skip_iteration(session: RunSession, iteration: int, quarantined: str) -> None:
    """Record ``iteration`` as skipped (its batch stays in quarantine; no update): an event and a commit marker."""
    message = f"iteration {iteration} skipped on resume; its batch stays quarantined in {quarantined}"
    row = event_row(session.run_id, iteration, "skipped_iteration", message)
    session.lake.write_rows("events", session.run_id, iteration, [row], stage=Stage.SKIP)
    session.lake.commit_iteration(session.run_id, iteration, {"skipped": True, "quarantine": quarantined})
    session.record.update(last_committed_iteration=iteration)
