"""The stages of a run as Prefect tasks: thin wrappers, each named as the core function it calls.

They share the in-memory run session, so they opt out of Prefect's input-hash caching (the lake's commit markers
are the source of truth for what is done). An iteration's task runs are named after their stage and iteration, as
Prefect's UI shows them: ``generate-i3``, ``persist-i3``, ..., ``commit-i3`` (the stage names are
:class:`~ragen_core.run.clock.IterationStage`'s, said once there).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen_core.config import RunConfig
from ragen_core.rollout import TrajectoryRecord
from ragen_core.run import bootstrap, resume, session, stages
from ragen_core.run.batches import BatchPipeline
from ragen_core.run.clock import IterationStage
from ragen_core.run.decisions import ResumePlan
from ragen_core.run.session import RunSession
from ragen_core.storage import DataLake
from schemas.manifest import RunManifest


def batch_run_name(stage: IterationStage) -> Callable[..., str]:
    """A ``task_run_name`` for the stages that take a training batch: ``<stage>-i<iteration>`` (``persist-i3``), as
    the iteration's other task runs are named (``generate-i3``, ``update-i3``, ...)."""

    def name(parameters: dict[str, Any]) -> str:
        return f"{stage}-i{parameters['pipeline'].meta.iteration}"

    return name


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


@task(name="skip_iteration", task_run_name=IterationStage.SKIP.run_name, cache_policy=NO_CACHE)
def skip_iteration(run: RunSession, iteration: int, quarantined: str) -> None:
    """Record a quarantined iteration as skipped."""
    resume.skip_iteration(run, iteration, quarantined)


@task(name="generate_rollouts", task_run_name=IterationStage.GENERATE.run_name, cache_policy=NO_CACHE)
def generate_rollouts(run: RunSession, iteration: int) -> list[TrajectoryRecord]:
    """The training rollouts of the iteration."""
    return stages.generate_rollouts(run, iteration)


@task(name="persist", task_run_name=batch_run_name(IterationStage.PERSIST), cache_policy=NO_CACHE)
def persist(pipeline: BatchPipeline, records: list[TrajectoryRecord]) -> dict:
    """Stage the batch as Parquet (invisible to readers until the filter publishes it)."""
    return pipeline.persist(records)


@task(name="validate", task_run_name=batch_run_name(IterationStage.VALIDATE), cache_policy=NO_CACHE)
def validate(pipeline: BatchPipeline) -> dict:
    """The data contracts; a failing batch is quarantined and the task fails."""
    return pipeline.validate()


@task(name="filter_and_publish", task_run_name=batch_run_name(IterationStage.FILTER), cache_policy=NO_CACHE)
def filter_and_publish(session: RunSession, pipeline: BatchPipeline) -> dict[str, float]:
    """The group filter the session's config sets, then publish the batch."""
    return stages.filter_and_publish(session, pipeline)


@task(name="diagnose_reasoning", task_run_name=IterationStage.DIAGNOSE.run_name, cache_policy=NO_CACHE)
def diagnose_reasoning(run: RunSession, iteration: int) -> dict[str, float]:
    """Input-reasoning mutual information (template-collapse diagnostic), before the update."""
    return stages.diagnose_reasoning(run, iteration)


@task(name="update_policy", task_run_name=IterationStage.UPDATE.run_name, cache_policy=NO_CACHE)
def update_policy(run: RunSession, iteration: int) -> dict[str, float]:
    """StarPO update on the kept trajectories."""
    return stages.update_policy(run, iteration)


@task(name="evaluate", task_run_name=IterationStage.EVALUATE.run_name, cache_policy=NO_CACHE)
def evaluate(run: RunSession, iteration: int, step: Callable[[str], None] | None = None) -> dict[str, float]:
    """Validation rollouts on the fixed instances (before the iteration's other stages, when due)."""
    return stages.evaluate(run, iteration, step)


@task(name="commit_iteration", task_run_name=IterationStage.COMMIT.run_name, cache_policy=NO_CACHE)
def commit_iteration(run: RunSession, iteration: int, metrics: dict[str, float], updated: bool) -> dict:
    """Checkpoint when due, metrics rows and the commit marker."""
    return stages.commit_iteration(run, iteration, metrics, updated)
