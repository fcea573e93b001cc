"""The decisions of starting a run, as pure functions of what is stored: no files, no engines, no Prefect.

Given the run's manifest, the config it is started with and the facts the lake reports (committed and skipped
iterations, complete checkpoints, a quarantined batch), they say whether the run starts fresh, starts over (it
stopped before its first session, e.g. in the bootstrap), resumes, is extended (a completed run given more
iterations: its final validation-only iteration is reopened as a training iteration) or is already done, and from
where a resume goes on: the next iteration, the checkpoint to load and the committed updates to replay from their
stored batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ragen_core.config import RunConfig, stored_config
from ragen_core.config.tree import PLACEMENT_KEYS
from ragen_core.run.schedule import Schedule
from schemas.manifest import RunManifest


class ResumeError(RuntimeError):
    """The run cannot be resumed as asked; the message says why and what to do."""


class ExtensionUndone(ResumeError):
    """An extension failed before it committed a new iteration and was undone: the run is completed, as it was."""


class Start(str, Enum):
    """How a ``train`` call begins."""

    FRESH = "fresh"  # no manifest: a new run
    OVER = "over"  # a manifest written before the run's first session: the bootstrap is redone, then a fresh start
    RESUME = "resume"  # committed iterations to continue from
    EXTEND = "extend"  # a completed run given more iterations: its final validation becomes a training iteration
    DONE = "done"  # every iteration and the final validation are committed: nothing to do


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

    def training_iterations(self, config: RunConfig) -> list[int]:
        """Committed iterations that trained (the collapse monitor's history): not skipped, not the final one."""
        return [i for i in self.committed if i < config.trainer.iterations and i not in self.skipped]


def resume_line(run_id: str, plan: ResumePlan, extending_to: int | None = None) -> str:
    """What a resume is about to do, said before it does it: where the run goes on, from which weights, and how many
    committed updates it replays (``extending_to``: the iterations an extended run is given)."""
    weights = f"its checkpoint after {plan.checkpoint_updates} updates" if plan.checkpoint else "its start model"
    replayed = len(plan.replay)
    replay = f", then replaying {replayed} committed update(s) from their stored batches" if replayed else ""
    more = f" (extending it to {extending_to} iterations)" if extending_to is not None else ""
    return f"resuming {run_id} at iteration {plan.next_iteration}{more}: loading {weights}{replay}"


def done_line(run_id: str, was: str | None) -> str:
    """What resuming a run that is done says: nothing to do, or, when its manifest said ``was`` instead of completed
    (a stop after its last commit; ``running``: its writer died there), that it is recorded completed now."""
    if was is None:
        return f"run {run_id} is already completed; nothing to do"
    why = "its writer died" if was == "running" else "it was stopped"
    return (
        f"run {run_id} had committed every iteration and its final validation, but its manifest said {was!r} ({why} "
        "after its last commit); it is recorded completed now, with nothing left to do"
    )


def decide_start(
    manifest: RunManifest | None,
    config: RunConfig,
    committed: list[int],
    allowed_changes: list[str],
    last_payload: dict[str, Any] | None = None,
) -> Start:
    """Fresh, over, resume, extend or done; refuses a run that is not a training run, a config that differs from the
    run's in keys not listed in ``allowed_changes``, and a config with fewer iterations than the run already trained.
    ``last_payload``: the commit payload of the last committed iteration (see :func:`final_evaluation`)."""
    if manifest is None:
        return Start.FRESH
    if manifest.kind != "train":
        raise ResumeError(f"{manifest.run_id!r} is a {manifest.kind} run, not a training run to resume")
    check_config(manifest, config, allowed_changes)
    if not manifest.model_dir:
        return Start.OVER
    iterations, final = config.trainer.iterations, final_evaluation(manifest, committed, last_payload)
    trained = final if final is not None else len(committed)  # iterations that ran (or may have run) an update
    if trained > iterations:
        raise ResumeError(
            f"run {manifest.run_id!r} already trained {trained} iterations, more than "
            f"trainer.iterations={iterations}: a run cannot be shortened. Evaluate an earlier checkpoint instead "
            f"(`ragen eval {manifest.run_id}@N`)"
        )
    if final is None:
        return Start.RESUME
    if (manifest.early_stop or {}).get("iteration") == final:
        return Start.DONE  # stopped early (filter_empty_stop_steps), then validated: more iterations change nothing
    if final == iterations:
        return Start.DONE
    refusal = Schedule.of(config).extension_refusal(manifest.run_id, final)
    if refusal is not None:
        raise ResumeError(refusal)
    return Start.EXTEND


def final_evaluation(
    manifest: RunManifest, committed: list[int], last_payload: dict[str, Any] | None = None
) -> int | None:
    """The committed iteration that is the run's final validation (no update), if the run got that far: the last
    committed one when its commit payload says it ran no update (``updated: false``); for a commit written before
    payloads said so, when it is the iteration after the stored config's last update."""
    if not committed:
        return None
    last = committed[-1]
    if last_payload is not None and "updated" in last_payload:
        return None if last_payload["updated"] else last
    return last if last == flatten(manifest.config or {}).get("trainer.iterations") else None


def plan_resume(
    run_id: str,
    config: RunConfig,
    committed: list[int],
    skipped: list[int],
    checkpoints: list[tuple[int, Path]],
    quarantined: str | None = None,
) -> ResumePlan:
    """Where to restart ``run_id``: the next iteration, the newest checkpoint the committed updates cover and the
    later updates to replay. ``checkpoints``: ``(updates, folder)`` of the run's complete checkpoints;
    ``quarantined``: the quarantine folder of the next iteration's batch, if it was rejected."""
    if committed != list(range(len(committed))):
        raise ResumeError(f"run {run_id!r} has gaps in its committed iterations {committed}; the lake was edited")
    next_iteration = len(committed)
    updates = min(next_iteration, config.trainer.iterations)  # training iterations done (each one update)
    usable = [(n, path) for n, path in checkpoints if n <= updates]
    checkpoint_updates, checkpoint = max(usable, key=lambda item: item[0]) if usable else (0, None)
    replay = [i for i in range(checkpoint_updates, updates) if i not in skipped]
    return ResumePlan(next_iteration, committed, skipped, checkpoint, checkpoint_updates, replay, quarantined)


def empty_filter_streak(history: list[dict[str, float]]) -> int:
    """The number of consecutive training iterations, counted back from the last one in ``history`` (the committed
    training iterations' metrics, in order), whose filter kept no group (``filter/kept_groups`` 0: RAGEN's
    ``empty_after_filter``)."""
    streak = 0
    for metrics in reversed(history):
        if metrics.get("filter/kept_groups", 1.0) != 0.0:
            break
        streak += 1
    return streak


def stops_early(history: list[dict[str, float]], empty_stop_steps: int) -> bool:
    """RAGEN-2's ``rollout_filter_empty_stop_steps``: whether training ends after the iterations of ``history``,
    because the last ``empty_stop_steps`` of them kept nothing (0: never). A pure function of the stored metrics, so
    a resumed run stops where the uninterrupted one did."""
    return empty_stop_steps > 0 and empty_filter_streak(history) >= empty_stop_steps


def check_resumable(
    plan: ResumePlan,
    run_id: str,
    skip_iteration: bool,
    quarantined_ahead: str | None = None,
    schedule: Schedule = Schedule(),
) -> None:
    """Refuse to redo a quarantined batch: the same seeds would regenerate the same batch. ``quarantined_ahead``: a
    quarantined batch of a later iteration (an async run samples ahead); an async run's ``schedule`` skips none:
    the iterations after a skipped one would lack the batches it needs."""
    refusal = schedule.skip_refusal(run_id, plan.next_iteration, plan.quarantined) if plan.quarantined else None
    if refusal is not None and skip_iteration:
        raise ResumeError(refusal)
    if quarantined_ahead:
        raise ResumeError(
            f"a training batch that run {run_id!r} sampled ahead of iteration {plan.next_iteration} was quarantined "
            f"({quarantined_ahead}, see report.json); resuming would sample it again from the same seeds and fail "
            "the same way, and --skip-iteration skips only the next iteration. Fix the cause (environment, reward "
            "bounds, contracts), then resume"
        )
    if plan.quarantined and not skip_iteration:
        raise ResumeError(
            f"iteration {plan.next_iteration} of run {run_id!r} was quarantined ({plan.quarantined}, see "
            "report.json). "
            "Resuming would regenerate exactly the same batch from the same seeds and fail the same way. Fix the "
            "cause (environment, reward bounds, contracts), or resume with --skip-iteration to record that iteration "
            "as skipped (no update) and go on with the next one"
        )


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
    key's default: the run behaved as the default says. Where the processes meet (:data:`PLACEMENT_KEYS`) is no
    change."""
    before, after = flatten(stored_config(old)), flatten(new)
    defaults = flatten(RunConfig().to_dict())
    return sorted(
        k
        for k in set(before) | set(after)
        if before.get(k) != after.get(k)
        and k not in PLACEMENT_KEYS
        and not (k not in before and k in defaults and after.get(k) == defaults[k])
    )


def check_config(manifest: RunManifest, config: RunConfig, allowed: list[str]) -> list[str]:
    """Refuse a resume whose config differs from the run's, except in ``allowed`` keys (or their sections)."""
    changed = config_changes(manifest.config or {}, config.to_dict())
    if not changed:
        return []
    blocked = [k for k in changed if not any(k == a or k.startswith(f"{a}.") for a in allowed)]
    if blocked:
        raise ResumeError(
            f"run {manifest.run_id!r} was started with another config (hash {manifest.config_hash}, "
            f"now {config.config_hash()}); changed keys: {', '.join(blocked)}. Resume with the run's own config "
            f"(`ragen resume RUN_ID`), or allow the change with --force-config {','.join(blocked)}"
        )
    return changed
