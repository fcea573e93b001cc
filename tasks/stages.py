"""A run's start, resume and skip as Prefect tasks: thin wrappers, each named as the core function it calls.

They share the in-memory run session, so they opt out of Prefect's input-hash caching (the lake's commit markers
are the source of truth for what is done). The stages of an iteration are tasks through one wrapper
(:mod:`tasks.iteration`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen_core.config import RunConfig
from ragen_core.run import bootstrap, resume, session
from ragen_core.run.clock import run_name
from ragen_core.run.decisions import ResumePlan
from ragen_core.run.session import RunSession
from ragen_core.storage import DataLake
from schemas.manifest import RunManifest


@task(name="bootstrap_model", cache_policy=NO_CACHE)
def bootstrap_model(
    config: RunConfig, lake: DataLake, base_dir: Path, report: Callable[[str], None]
) -> tuple[Path, dict[str, Any]]:
    """Scripted demonstrations + supervised update (a line per step to ``report``); the bootstrapped model folder."""
    return bootstrap.bootstrap_model(config, lake, base_dir, report)


@task(name="base_model_dir", cache_policy=NO_CACHE)
def base_model_dir(config: RunConfig, lake: DataLake) -> Path:
    """The model a fresh run starts from (``model.path`` or the tiny default, built if absent)."""
    return session.base_model_dir(config, lake)


@task(name="open_session", cache_policy=NO_CACHE)
def open_session(
    config: RunConfig,
    lake: DataLake,
    run_id: str,
    model_dir: Path,
    resumed: RunManifest | None = None,
    training: bool = True,
) -> RunSession:
    """Start the updater (the DeepSpeed engines) and the rollout side; write the manifest."""
    return session.open_session(config, lake, run_id, model_dir, resumed=resumed, training=training)


@task(name="prepare_resume", cache_policy=NO_CACHE)
def prepare_resume(lake: DataLake, config: RunConfig, run_id: str, skip_iteration: bool) -> ResumePlan:
    """The resume plan (gaps and a quarantined batch refused); the run's uncommitted output discarded."""
    return resume.prepare_resume(lake, config, run_id, skip_iteration)


@task(name="prepare_extension", cache_policy=NO_CACHE)
def prepare_extension(lake: DataLake, manifest: RunManifest, config: RunConfig, run_id: str) -> ResumePlan:
    """The plan of extending a completed run (nothing written)."""
    return resume.prepare_extension(lake, manifest, config, run_id)


@task(name="reopen_final_evaluation", cache_policy=NO_CACHE)
def reopen_final_evaluation(run: RunSession, plan: ResumePlan) -> list[str]:
    """Reopen a completed run's final validation as a training iteration whose validation is reused."""
    return resume.reopen_final_evaluation(run, plan)


@task(name="restore_session", cache_policy=NO_CACHE)
def restore_session(run: RunSession, plan: ResumePlan) -> dict[str, Any]:
    """Load the checkpoint and replay the committed updates after it."""
    return resume.restore_session(run, plan)


@task(name="skip_iteration", task_run_name=run_name("skip"), cache_policy=NO_CACHE)
def skip_iteration(run: RunSession, iteration: int, quarantined: str) -> None:
    """Record a quarantined iteration as skipped."""
    resume.skip_iteration(run, iteration, quarantined)
