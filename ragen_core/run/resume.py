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

Extending a completed run (more ``trainer.iterations``) is a resume whose last committed iteration, the final
validation (no update), is reopened: its validation rows stay and are reused, its commit is withdrawn, and the
iteration is run again as a training iteration, as the run configured longer from the start ran it. Nothing is
changed before the session is open and restored (:func:`prepare_extension`, then :func:`reopen_final_evaluation`);
the reopened final validation is kept in memory until the iteration commits again, so an extension that fails before
then puts the completed run back as it was (:func:`undo_extension`).
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragen_core.config import RunConfig
from ragen_core.config.trust import TRUSTED_PATHS_VARIABLE, trusted_path
from ragen_core.envs.external import metric_env_name
from ragen_core.run.decisions import (
    ExtensionUndone,
    ResumeError,
    ResumePlan,
    Start,
    check_resumable,
    decide_start,
    final_evaluation,
    plan_resume,
)
from ragen_core.run.record import STOP_FIELDS, utc_now
from ragen_core.run.schedule import Schedule
from ragen_core.storage import DataLake, Stage, event_row
from ragen_core.storage.files import discard
from ragen_core.storage.layout import (
    CHECKPOINT_ADAPTER,
    CHECKPOINT_HF,
    checkpoint_file,
    compaction_marker,
    manifest_file,
    published_by_stage,
)
from ragen_core.storage.locks import run_lock
from ragen_core.storage.maintenance.space import SPACE_PREFIX
from schemas.manifest import RunManifest

if TYPE_CHECKING:  # the session (torch, the engines) is not imported by the CLI's quick answers, which use this module
    import pyarrow as pa

    from ragen_core.run.session import RunSession


def decide_run_start(
    lake: DataLake, manifest: RunManifest | None, config: RunConfig, run_id: str, allowed_changes: list[str]
) -> Start:
    """:func:`ragen_core.run.decisions.decide_start` on what the lake reports of ``run_id`` (reads only)."""
    committed = lake.committed_iterations(run_id)
    last_payload = lake.commit_payload(run_id, committed[-1]) if committed else None
    start = decide_start(manifest, config, committed, allowed_changes, last_payload)
    if start in (Start.RESUME, Start.EXTEND) and manifest is not None:
        check_stored_start_model(lake, run_id, manifest, config)
    if start == Start.EXTEND:
        refuse_compacted_final(lake, run_id, committed[-1])
    return start


def record_done(lake: DataLake, run_id: str) -> str | None:
    """A run decided done (every iteration and its final validation committed) whose manifest does not say so: a
    stop that landed after its last commit left it ``interrupted`` (or ``failed``), or its writer died there and left
    it ``running`` (the caller holds the run's writer lock, so no writer lives). It is recorded ``completed`` now, its
    stop fields removed; nothing else is left to do. Returns the status it had, None when it said completed."""
    manifest = lake.read_manifest(run_id)
    if manifest is None or manifest.status == "completed":
        return None
    stop = [name for name in STOP_FIELDS if name != "last_committed_iteration"]
    done = manifest.without("error", *stop).updated(
        status="completed", last_committed_iteration=lake.committed_iterations(run_id)[-1], updated_at=utc_now()
    )
    lake.write_manifest(run_id, done)
    return manifest.status


def check_stored_start_model(lake: DataLake, run_id: str, manifest: RunManifest, config: RunConfig) -> None:
    """A resume starts its engines from the model the manifest names (``model_dir``): read only when it lies inside
    the data root or a folder the user trusts (:func:`ragen_core.config.trust.trusted_path`), or is the config's own
    ``model.path`` (which the user named, or a trusted folder holds); else :class:`ResumeError` saying how to allow
    it. A planted manifest cannot make a resume read (and checkpoint into the shared root) a model from elsewhere."""
    model_dir = manifest.model_dir or ""
    if not model_dir or trusted_path(model_dir, lake.root):
        return
    if config.model.path and Path(config.model.path).expanduser().resolve() == Path(model_dir).expanduser().resolve():
        return
    source = manifest_file(lake.run_dir(run_id)).relative_to(lake.root)
    raise ResumeError(
        f"{source} names the start model {model_dir!r}, outside the data root and not the config's model.path; a "
        f"manifest does not name folders outside the data root: pass {shlex.quote('model.path=' + model_dir)} again "
        f"to use it (or list its folder in {TRUSTED_PATHS_VARIABLE})"
    )


def refuse_compacted_final(lake: DataLake, run_id: str, iteration: int) -> None:
    """An extension reopens the final validation's iteration and keeps its validation files by their stage names;
    ``ragen runs compact`` merged them into one file of no stage, which the reopening would discard with its rows.
    Refused (:class:`ResumeError`) when any table's partition of ``iteration`` was compacted."""
    compacted = [
        table
        for table in sorted(lake.tables)
        if lake.spec(table).source == "parquet"
        and compaction_marker(lake.partition_dir(table, run_id, iteration)).exists()
    ]
    if compacted:
        latest = lake.latest_checkpoint(run_id)
        start = f"model.path={checkpoint_file(latest[1], CHECKPOINT_HF)}" if latest else "a new run"
        if latest and checkpoint_file(latest[1], CHECKPOINT_ADAPTER).is_dir():
            manifest, adapter = lake.read_manifest(run_id), checkpoint_file(latest[1], CHECKPOINT_ADAPTER)
            base = manifest.model_dir if manifest is not None and manifest.model_dir else "<its start model>"
            start = f"model.path={base} model.adapter={adapter}"
        raise ResumeError(
            f"run {run_id!r} cannot be extended: its final iteration {iteration} was compacted (`ragen runs compact`; "
            f"tables {', '.join(compacted)}). Start a new run from its last checkpoint instead: {start}"
        )


def prepare_extension(lake: DataLake, manifest: RunManifest, config: RunConfig, run_id: str) -> ResumePlan:
    """The plan of extending a completed run (reads only): a resume at its final validation's iteration, which is
    to be reopened (:func:`reopen_final_evaluation`) and trained; its validation stages are the reused ones."""
    committed = lake.committed_iterations(run_id)
    last = lake.commit_payload(run_id, committed[-1]) if committed else None
    final = final_evaluation(manifest, committed, last)
    if final is None:  # decide_start chose to extend, so the final validation is committed
        raise ValueError(f"run {run_id!r} has no committed final validation to extend from")
    trained = committed[:-1]
    skipped = [i for i in trained if lake.commit_payload(run_id, i).get("skipped")]
    plan = plan_resume(run_id, config, trained, skipped, lake.list_checkpoints(run_id))
    envs = sorted(set(lake.read_table("trajectories", run_id, final, columns=["env"])["env"].to_pylist()))
    return dataclasses.replace(plan, reused_stages=[Stage.evaluation(env) for env in envs])


@dataclass(frozen=True)
class ReopenedFinal:
    """A committed final validation as an extension found it: its iteration, its validation stages (reused), its
    commit's payload and rows (by table) and the run's manifest before the extension; what :func:`undo_extension`
    puts back."""

    iteration: int
    reused_stages: list[str]
    payload: dict[str, Any]
    rows: dict[str, pa.Table]
    manifest: RunManifest


def reopen_final_evaluation(session: RunSession, plan: ResumePlan, stored: RunManifest) -> list[str]:
    """Turn the committed final validation (iteration ``plan.next_iteration``) back into an uncommitted iteration
    whose validation stages finished: each env's stage is marked done with its committed ``val/<env>/*`` metrics
    (so the iteration reuses them), then the commit marker is withdrawn and the iteration's commit rows (metrics,
    evaluations, events) are discarded. A crash midway leaves either the completed run or an interrupted one that
    ``ragen resume`` continues. The final validation as it was, with ``stored`` (the run's manifest before the
    extension), is kept for the session's record to put back should the extension fail before the iteration
    commits again (:func:`undo_extension`). Returns the reused stages."""
    lake, run_id, iteration = session.lake, session.run_id, plan.next_iteration
    with run_lock(lake, run_id):  # no compaction while the iteration is reopened (it merges committed files only)
        refuse_compacted_final(lake, run_id, iteration)  # compacted since the command decided to extend
        rows = _commit_rows(lake, run_id, iteration)
        final = ReopenedFinal(iteration, plan.reused_stages, lake.commit_payload(run_id, iteration), rows, stored)
        metrics = lake.read_table("metrics", run_id, iteration, columns=["name", "value"]).to_pylist()
        for stage in plan.reused_stages:
            env = stage.removeprefix(Stage.evaluation(""))
            # the env's metric name, or the whole import path a run made before the short names stored
            prefixes = (f"val/{metric_env_name(env)}/", f"val/{env}/")
            values = {row["name"]: row["value"] for row in metrics if row["name"].startswith(prefixes)}
            lake.mark_stage_done(run_id, iteration, stage, {"metrics": values})
        lake.withdraw_commit(run_id, iteration)
        reused = lake.discard_uncommitted(run_id, iteration)
    session.record.undo = functools.partial(undo_extension, session, final)
    session.record.update(
        attempt={"extended_from": iteration, "reused_stages": reused},
        last_committed_iteration=iteration - 1 if iteration else None,
    )
    return reused


def _commit_rows(lake: DataLake, run_id: str, iteration: int) -> dict[str, pa.Table]:
    """The rows the commit of ``iteration`` published, by table (the tables whose files of that iteration the
    commit published; a final validation's other files are its validation stages', which the extension keeps)."""
    rows = {}
    for table in sorted(name for name, spec in lake.tables.items() if spec.source == "parquet"):
        files = lake.partition_files(table, run_id, iteration)
        if files and all(published_by_stage(path.name, [Stage.COMMIT]) for path in files):
            rows[table] = lake.read_table(table, run_id, iteration)
    return rows


def undo_extension(session: RunSession, final: ReopenedFinal, error: str) -> ExtensionUndone | None:
    """After ``error`` (its line) stopped an extension before it committed its reopened iteration: put the run back
    as it was before the extension (what that iteration published and staged discarded, its final validation's
    commit rows and marker written again, a checkpoint the extension completed removed, the stored manifest back:
    completed, its config) and return the error that says so. None, with nothing changed, once the iteration is
    committed (the run is then the longer run, which ``ragen resume`` continues) or when the lake cannot be put
    back (the disk still full: the failed extension is recorded as such, and resumable)."""
    lake, run_id, iteration = session.lake, session.run_id, final.iteration
    if iteration in lake.committed_iterations(run_id):
        return None
    try:
        with run_lock(lake, run_id):
            lake.discard_uncommitted(run_id, iteration, keep={iteration: final.reused_stages})
            for table, rows in final.rows.items():
                lake.write_rows(table, run_id, iteration, rows, stage=Stage.COMMIT, publish=False)
            lake.publish(run_id, iteration, Stage.COMMIT)
            lake.commit_iteration(run_id, iteration, final.payload)
        for updates, folder in lake.list_checkpoints(run_id):
            if updates > iteration:  # the extension's, of updates the run no longer has
                discard(folder)
        lake.write_manifest(run_id, final.manifest)
    except Exception:  # noqa: BLE001 - whatever keeps it from being put back, the extension's own failure is told
        return None
    session.record.manifest = final.manifest
    if error.startswith(SPACE_PREFIX):  # its advice (resume the run) would find it completed: extend it again
        error = error.split(": free space", 1)[0]
        again = "; free space or raise the limit (ulimit -f), then run the same command again to extend it"
    else:
        again = "; run the same command again to extend it"
    return ExtensionUndone(
        f"{error}. The extension was undone: run {run_id} is left completed at {iteration} iterations, as it was "
        f"(its config and every committed row){again}"
    )


def prepare_resume(lake: DataLake, config: RunConfig, run_id: str, skip_iteration: bool) -> ResumePlan:
    """The checks of a resume that need the lake (gaps, a quarantined batch), then the plan; the uncommitted output
    of the next iterations is discarded (the finished stages of the next one are kept, to be reused). The config was
    checked against the manifest by :func:`ragen_core.run.decisions.decide_start`, which chose to resume."""
    committed = lake.committed_iterations(run_id)
    skipped = [i for i in committed if lake.commit_payload(run_id, i).get("skipped")]
    quarantine = lake.quarantine_dir(run_id, len(committed), Stage.ROLLOUT)
    quarantined = str(quarantine) if quarantine.is_dir() else None
    plan = plan_resume(run_id, config, committed, skipped, lake.list_checkpoints(run_id), quarantined)
    schedule = Schedule.of(config)
    following = schedule.batches_ahead(plan.next_iteration, config.trainer.iterations)
    sampled = schedule.sampled_ahead(plan.next_iteration)  # what the lanes may have sampled ahead
    ahead = (lake.quarantine_dir(run_id, i, Stage.ROLLOUT) for i in sampled)
    check_resumable(plan, run_id, skip_iteration, next((str(q) for q in ahead if q.is_dir()), None), schedule)
    keep = {plan.next_iteration: lake.finished_stages(run_id, plan.next_iteration)}
    keep.update({i: [Stage.ROLLOUT] for i in following})  # an async run's batches sampled ahead: kept and used
    reused = lake.discard_uncommitted(run_id, plan.next_iteration, keep)
    return dataclasses.replace(plan, reused_stages=reused)


def restore_session(session: RunSession, plan: ResumePlan) -> dict[str, Any]:
    """Bring a freshly opened session to the state after the committed iterations: the updater loads the checkpoint
    and replays the later committed updates from their stored batches, the rollout side takes the weights, and the
    collapse monitor gets its metric history back."""
    session.updater.restore(plan.checkpoint, plan.replay)
    session.updater.version = plan.next_iteration  # every committed iteration's update, a skipped one's included
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
    if session.record.manifest.resumes:
        session.record.update(attempt=restored)
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
    session.updater.version = iteration + 1  # the next batch's policy version moves on; its weights do not
    if session.policy is not None:  # a session that samples
        session.policy.relabel(iteration + 1)
