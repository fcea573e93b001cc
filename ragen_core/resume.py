"""Resuming a run from its last committed point (README, "exact resume").

The lake is the source of truth. Iteration i is done when its commit marker exists; its marker is written after its
update, metrics and (when due) checkpoint. A resumed run:

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
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_core.config import RunConfig, stored_config
from ragen_core.session import RunSession
from ragen_core.storage import DataLake
from ragen_core.storage.files import read_json
from schemas.tables import TABLES


class ResumeError(RuntimeError):
    """The run cannot be resumed as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ResumePlan:
    """Where a resumed run starts."""

    next_iteration: int  # first iteration without a commit marker
    committed: list[int]  # committed iterations (training iterations and, at the end, the final evaluation)
    skipped: list[int]  # committed iterations that were skipped (no update)
    checkpoint: Path | None  # engine state to load; None: start from the run's start model
    checkpoint_updates: int  # updates the checkpoint holds (0 without one)
    replay: list[int] = field(default_factory=list)  # committed iterations whose updates are replayed
    quarantined: str | None = None  # quarantine folder of the next iteration, if its batch was rejected
    reused_stages: list[str] = field(default_factory=list)  # finished stages of the next iteration, kept as they are


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two resolved config trees.

    A key the old tree lacks (a run started before the key existed) counts as unchanged when the new value is that
    key's default: the run behaved as the default says."""
    before, after = flatten(stored_config(old)), flatten(new)
    defaults = flatten(RunConfig().to_dict())
    return sorted(
        k
        for k in set(before) | set(after)
        if before.get(k) != after.get(k) and not (k not in before and k in defaults and after.get(k) == defaults[k])
    )


def check_config(manifest: dict[str, Any], config: RunConfig, allowed: list[str]) -> list[str]:
    """Refuse a resume whose config differs from the run's, except in ``allowed`` keys (or their sections)."""
    changed = config_changes(manifest.get("config", {}), config.to_dict())
    if not changed:
        return []
    blocked = [k for k in changed if not any(k == a or k.startswith(f"{a}.") for a in allowed)]
    if blocked:
        raise ResumeError(
            f"run {manifest.get('run_id')!r} was started with another config (hash {manifest.get('config_hash')}, "
            f"now {config.config_hash()}); changed keys: {', '.join(blocked)}. Resume with the run's own config "
            f"(`ragen resume RUN_ID`), or allow the change with --force-config {','.join(blocked)}"
        )
    return changed


def skipped_iterations(lake: DataLake, run_id: str) -> list[int]:
    """Committed iterations whose marker says they were skipped."""
    skipped = []
    for iteration in lake.committed_iterations(run_id):
        if read_json(lake.commit_marker(run_id, iteration)).get("skipped"):
            skipped.append(iteration)
    return skipped


def plan_resume(lake: DataLake, run_id: str, config: RunConfig, checkpoints: list[tuple[int, Path]]) -> ResumePlan:
    """Where to restart ``run_id``: the next iteration, the checkpoint to load and the updates to replay.

    ``checkpoints`` lists ``(updates, path)`` of the run's complete checkpoints.
    """
    committed = lake.committed_iterations(run_id)
    if committed != list(range(len(committed))):
        raise ResumeError(f"run {run_id!r} has gaps in its committed iterations {committed}; the lake was edited")
    next_iteration = len(committed)
    skipped = skipped_iterations(lake, run_id)
    updates = min(next_iteration, config.trainer.iterations)  # training iterations done (each one update)
    usable = [(n, path) for n, path in checkpoints if n <= updates]
    checkpoint_updates, checkpoint = max(usable, key=lambda item: item[0]) if usable else (0, None)
    replay = [i for i in range(checkpoint_updates, updates) if i not in skipped]
    quarantine = lake.quarantine_dir(run_id, next_iteration, "rollout")
    return ResumePlan(
        next_iteration=next_iteration,
        committed=committed,
        skipped=skipped,
        checkpoint=checkpoint,
        checkpoint_updates=checkpoint_updates,
        replay=replay,
        quarantined=str(quarantine) if quarantine.is_dir() else None,
    )


def _file_stage(name: str) -> str:
    """The stage of a part file named ``part-<stage>-<k>.parquet``."""
    return name.removeprefix("part-").removesuffix(".parquet").rsplit("-", 1)[0]


def discard_uncommitted(lake: DataLake, run_id: str, from_iteration: int) -> list[str]:
    """Clear iterations ``>= from_iteration`` (none is committed) for a redo; return the reused stages.

    The stages of ``from_iteration`` that finished (a ``_DONE.json`` marker, written after their publish) keep their
    published files and are reused; every other staged or published file of those iterations is deleted (renamed to
    a hidden name first, so readers stop seeing it at once).
    """
    if any(i >= from_iteration for i in lake.committed_iterations(run_id)):
        raise ResumeError(f"refusing to discard committed iterations >= {from_iteration} of run {run_id!r}")
    staging = lake.root / "_staging" / run_id
    iterations = [int(p.name) for p in staging.iterdir() if p.name.isdigit()] if staging.is_dir() else []
    reused = sorted(
        stage.name
        for stage in (staging / str(from_iteration)).glob("*")
        if lake.stage_result(run_id, from_iteration, stage.name) is not None
    )
    for iteration in iterations:
        if iteration < from_iteration:
            continue
        for stage in sorted((staging / str(iteration)).iterdir()):
            keep = iteration == from_iteration and stage.name in reused
            for item in stage.iterdir() if keep else [stage]:
                if item.name != "_DONE.json":
                    _discard(item)
    for table in sorted(name for name, spec in TABLES.items() if spec.source == "parquet"):
        run_folder = lake.table_dir(table) / f"run_id={run_id}"
        for partition in sorted(run_folder.glob("iteration=*")) if run_folder.is_dir() else []:
            iteration = int(partition.name.split("=")[1])
            if iteration < from_iteration:
                continue
            for file in sorted(partition.glob("part-*.parquet")):
                if iteration != from_iteration or _file_stage(file.name) not in reused:
                    _discard(file)
    return reused


def _discard(path: Path) -> None:
    hidden = path.with_name(f".discard-{path.name}-{os.getpid()}")
    os.replace(path, hidden)
    if hidden.is_dir():
        shutil.rmtree(hidden)
    else:
        hidden.unlink()


def check_resumable(plan: ResumePlan, run_id: str, skip_iteration: bool) -> None:
    """Refuse to redo a quarantined batch: the same seeds would regenerate the same batch."""
    if plan.quarantined and not skip_iteration:
        raise ResumeError(
            f"iteration {plan.next_iteration} of run {run_id!r} was quarantined ({plan.quarantined}, see "
            "report.json). "
            "Resuming would regenerate exactly the same batch from the same seeds and fail the same way. Fix the "
            "cause (environment, reward bounds, contracts), or resume with --skip-iteration to record that iteration "
            "as skipped (no update) and go on with the next one"
        )


def metric_history(lake: DataLake, run_id: str, iterations: list[int]) -> list[dict[str, float]]:
    """The stored metrics of ``iterations``, one dict per iteration in order (for the collapse monitor)."""
    if not iterations:
        return []
    table = lake.read_table("metrics", run_id).to_pylist()
    history: dict[int, dict[str, float]] = {i: {} for i in iterations}
    for row in table:
        if row["iteration"] in history:
            history[row["iteration"]][row["name"]] = row["value"]
    return [history[i] for i in iterations]


def restore_session(session: RunSession, plan: ResumePlan) -> dict[str, Any]:
    """Bring a freshly opened session to the state after the committed iterations: load the checkpoint, replay the
    later committed updates from their stored batches, and reload the metric history of the collapse monitor."""
    from ragen_core.session import sync_rollout_weights
    from ragen_core.stages import update_policy
    from ragen_core.training.checkpoint import load_checkpoint

    if session.update_group is not None:  # the launched group loads and replays; the rollout side takes its export
        sync_rollout_weights(session, session.update_group.restore(plan.checkpoint, plan.replay))
    else:
        if plan.checkpoint is not None:
            load_checkpoint(plan.checkpoint, session.actor, session.critic)
        for iteration in plan.replay:
            update_policy(session, iteration)  # same stored batch, same seeds, same starting weights: same update
        if plan.checkpoint is not None and not plan.replay:
            sync_rollout_weights(session)  # a vLLM engine takes the loaded weights (nothing to do otherwise)
    training = [i for i in plan.committed if i < session.config.trainer.iterations and i not in plan.skipped]
    session.metric_history = metric_history(session.lake, session.run_id, training)
    restored = {
        "checkpoint": str(plan.checkpoint) if plan.checkpoint else None,
        "checkpoint_updates": plan.checkpoint_updates,
        "replayed": plan.replay,
        "next_iteration": plan.next_iteration,
        "reused_stages": plan.reused_stages,
    }
    if session.manifest.get("resumes"):
        session.manifest["resumes"][-1].update(restored)
        session.update_manifest()
    return restored


def prepare_resume(
    lake: DataLake,
    config: RunConfig,
    run_id: str,
    manifest: dict[str, Any],
    allowed_changes: list[str],
    skip_iteration: bool,
) -> ResumePlan:
    """All checks of a resume, then the plan; uncommitted output of the next iterations is discarded."""
    from ragen_core.training.checkpoint import list_checkpoints

    if manifest.get("kind") == "bootstrap":
        raise ResumeError(f"{run_id!r} is a bootstrap run (scripted demonstrations), not a training run to resume")
    check_config(manifest, config, allowed_changes)
    plan = plan_resume(lake, run_id, config, list_checkpoints(lake.root, run_id))
    if plan.next_iteration > config.trainer.iterations:
        return plan  # completed: nothing to redo
    check_resumable(plan, run_id, skip_iteration)
    reused = discard_uncommitted(lake, run_id, plan.next_iteration)
    return dataclasses.replace(plan, reused_stages=reused)


def skip_iteration(session: RunSession, iteration: int, quarantined: str) -> None:
    """Record ``iteration`` as skipped (its batch stays in quarantine; no update): an event and a commit marker."""
    from ragen_core.storage import event_row

    message = f"iteration {iteration} skipped on resume; its batch stays quarantined in {quarantined}"
    row = event_row(session.run_id, iteration, "skipped_iteration", message)
    session.lake.write_rows("events", session.run_id, iteration, [row], stage="skip")
    session.lake.commit_iteration(session.run_id, iteration, {"skipped": True, "quarantine": quarantined})
    session.update_manifest(last_committed_iteration=iteration)
