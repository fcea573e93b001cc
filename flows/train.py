"""The ``train`` flow (fresh or resumed) and its iterations (``starpo_iteration``: a group of its tasks)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flows import ui
from ragen_core.config import RunConfig
from ragen_core.run.checks import build_run_config, load_run_config
from ragen_core.run.decisions import ResumePlan, Start, resume_line
from ragen_core.run.entry import check_run_id, open_run, run_lake
from ragen_core.run.iteration import IterationState, run_iteration
from ragen_core.run.record import RunRecord, default_run_id, new_manifest, run_status
from ragen_core.run.resume import decide_run_start
from ragen_core.run.session import RunSession
from ragen_core.run.stages import FINAL_VALIDATION, ITERATION, stop_early
from ragen_core.storage import DataLake
from schemas.manifest import RunManifest
from tasks import reporting as r
from tasks import stages as t
from tasks.iteration import call_as_task


def resolve_config(config: RunConfig | dict[str, Any] | str | None, overrides: list[str] | None = None) -> RunConfig:
    """A config tree, or the path of a YAML config file, plus ``key.sub=value`` overrides, validated. A
    :class:`RunConfig` (what the CLI passes, having validated it) is used as it is: a config is validated once."""
    if isinstance(config, RunConfig) and not overrides:
        return config
    if isinstance(config, RunConfig):
        config = config.to_dict()
    if config is None or isinstance(config, str):
        return load_run_config(config, list(overrides or []))
    return build_run_config(config, list(overrides or []))


def starpo_iteration(
    session: RunSession, iteration: int, artifacts: r.IterationArtifacts | None = None
) -> dict[str, float]:
    """One StarPO iteration: the due steps of :data:`ragen_core.run.stages.ITERATION` ([evaluate] -> generate ->
    persist -> validate -> filter -> [diagnose] -> update -> commit), each a Prefect task, then the artifact (in the
    background through ``artifacts``; without it, before returning).

    A group of tasks of the ``train`` flow, not a subflow: measured at the demo config, a subflow per iteration plus
    Prefect walking the rollout records for futures cost ~1.7 s of a 3.3 s iteration (benchmarks/RESULTS.md, section
    3); the steps get the session and their state quoted (:func:`tasks.iteration.call_as_task`)."""
    metrics = run_iteration(session, iteration, ITERATION, call=call_as_task)
    _publish(artifacts, session.run_id, iteration, metrics)
    return metrics


def _publish(artifacts: r.IterationArtifacts | None, run_id: str, iteration: int, metrics: dict[str, float]) -> None:
    if artifacts is None:
        r.publish_iteration_artifact(run_id, iteration, metrics)
    else:
        artifacts.publish(run_id, iteration, metrics)


def final_evaluation(
    session: RunSession, iteration: int, step: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Validation of the final policy, committed as its own iteration (``iteration`` = number of updates:
    :data:`ragen_core.run.stages.FINAL_VALIDATION`); ``step`` hears of each env."""
    metrics = run_iteration(session, iteration, FINAL_VALIDATION, call=call_as_task, state=IterationState(tell=step))
    r.publish_iteration_artifact(session.run_id, iteration, metrics)
    return metrics


Opened = tuple[RunSession | None, ResumePlan | None, dict[str, Any]]


def _open(run_config: RunConfig, lake: DataLake, run_id: str, force_config: list[str], skip_iteration: bool) -> Opened:
    """The session of a fresh run (after its bootstrap) or of a resumed one (checked, its uncommitted output
    discarded: the plan says what to restore); no session when the run is already done."""
    manifest = lake.read_manifest(run_id)
    start = decide_run_start(lake, manifest, run_config, run_id, force_config)
    if start is Start.DONE:
        return None, None, {"completed": True, "bootstrap": manifest.bootstrap}
    if start in (Start.FRESH, Start.OVER):
        session, bootstrap = _start(run_config, lake, run_id, manifest)
        return session, None, {"bootstrap": bootstrap}
    if start is Start.EXTEND:
        return _extend(run_config, lake, run_id, manifest)
    plan = t.prepare_resume(lake, run_config, run_id, skip_iteration)
    ui.step(resume_line(run_id, plan))
    try:
        session = t.open_session(run_config, lake, run_id, Path(manifest.model_dir), manifest)
    except BaseException as exc:  # a failed resume says so in the manifest (a refused one, above, changes nothing)
        RunRecord(lake, run_id, manifest).stopped(exc)
        raise
    return session, plan, {"bootstrap": manifest.bootstrap}


def _extend(run_config: RunConfig, lake: DataLake, run_id: str, manifest: RunManifest) -> Opened:
    """A completed run given more iterations: the session is opened and restored first; until then a failure puts
    the stored manifest back (the run stays completed, with its config) and the lake is untouched. Only then is the
    final validation reopened as the next training iteration."""
    plan = t.prepare_extension(lake, manifest, run_config, run_id)
    ui.step(resume_line(run_id, plan, run_config.trainer.iterations))
    session = None
    try:
        session = t.open_session(run_config, lake, run_id, Path(manifest.model_dir), manifest)
        restored = t.restore_session(session, plan)
    except BaseException:
        if session is not None:
            session.close()
        lake.write_manifest(run_id, manifest)
        raise
    try:
        t.reopen_final_evaluation(session, plan)
    except BaseException as exc:
        session.record.stopped(exc)
        session.close()
        raise
    info = {"bootstrap": manifest.bootstrap, "resumed": {**restored, "extended_from": plan.next_iteration}}
    return session, plan, info


def _start(
    run_config: RunConfig, lake: DataLake, run_id: str, manifest: RunManifest | None
) -> tuple[RunSession, dict[str, Any] | None]:
    """Start a run: its manifest first (so a run killed in the bootstrap is known and resumable), then the start
    model, the bootstrap and the session. ``manifest``: the one an earlier attempt left before its session."""
    early = new_manifest(run_config, run_id, None, None) if manifest is None else manifest.updated(status="running")
    record = RunRecord(lake, run_id, early)
    record.update()
    try:
        start_dir = t.base_model_dir(run_config, lake)
        summary = t.bootstrap_model(run_config, lake, start_dir, ui.step) if run_config.bootstrap.enabled else None
        session = t.open_session(run_config, lake, run_id, summary[0] if summary else start_dir, manifest)
    except BaseException as exc:
        record.stopped(exc)
        raise
    # a fresh run's session wrote a full manifest: keep the run's first moment
    first = {"created_at": early.created_at, "started_at": early.started_at} if manifest is None else {}
    session.record.update(bootstrap=summary[1] if summary else None, **first)
    return session, summary[1] if summary else None


@ui.flow(name="train", flow_run_name=ui.named_after("run_id"), validate_parameters=False)
def train(
    config: RunConfig | dict[str, Any] | str | None = None,
    data_root: str = "data",
    run_id: str | None = None,
    force_config: list[str] | None = None,
    skip_iteration: bool = False,
    overrides: list[str] | None = None,
    sweep: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train one run: [bootstrap] -> session -> ``trainer.iterations`` x starpo_iteration -> final validation.

    ``config`` is a config tree or the path of a YAML file (deployments pass a path relative to the project), with
    ``overrides`` (``key.sub=value``) applied on top. An existing ``run_id`` is resumed from its last committed
    iteration (same config, unless ``force_config`` lists the keys allowed to change; ``skip_iteration`` skips an
    iteration whose batch was quarantined). ``sweep`` (``{id, point, overrides}``) is recorded in the manifest of a
    sweep's point. Progress goes to the caller through :func:`flows.ui.watching`, not a parameter.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    check_run_id(run_id)  # a name, never a pattern or a path: refused before anything is read or created
    run_config = resolve_config(config, overrides)
    lake = run_lake(data_root)
    run_id = check_run_id(run_id or default_run_id(run_config))
    tags = ui.run_tags(run_config.env.name, run_config.algorithm.preset, (sweep or {}).get("id"))
    with ui.showing(run_id, tags), open_run(lake, run_id) as run:  # one writer per run (the CLI's hold, joined)
        note = run.takeover_note
        if note:
            logging.getLogger(__name__).warning(note)
        return _train(run_config, lake, run_id, list(force_config or []), skip_iteration, sweep)


def _train(
    run_config: RunConfig,
    lake: DataLake,
    run_id: str,
    force_config: list[str],
    skip_iteration: bool,
    sweep: dict[str, Any] | None,
) -> dict[str, Any]:
    """The body of :func:`train`, under the run's writer lock: open, [restore], iterations, final validation."""
    session, plan, info = _open(run_config, lake, run_id, force_config, skip_iteration)
    result = {"run_id": run_id, "data_root": str(lake.root), "iterations": run_config.trainer.iterations, **info}
    if session is None:
        return result
    with run_status(session):
        if sweep is not None:
            session.record.update(sweep=sweep)
        first = 0
        if plan is not None:
            if "resumed" not in result:  # an extension restored its session when it opened it
                result["resumed"] = t.restore_session(session, plan)
            first = plan.next_iteration
            if plan.quarantined:  # only reachable with skip_iteration (prepare_resume refuses otherwise)
                t.skip_iteration(session, first, plan.quarantined)
                first += 1
        artifacts = r.IterationArtifacts()
        final = run_config.trainer.iterations
        try:
            for iteration in range(first, run_config.trainer.iterations):
                if stop_early(session, iteration):  # filter_empty_stop_steps: the final validation comes here
                    final = iteration
                    break
                ui.report(iteration, starpo_iteration(session, iteration, artifacts))
        except BaseException:
            artifacts.wait(raise_error=False)
            raise
        artifacts.wait()
        ui.report(final, final_evaluation(session, final))
    return {**result, "first_iteration": first}
