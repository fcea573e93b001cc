"""Prefect artifacts: what users see of a run and a sweep in the Prefect UI (thin wrappers over ragen_core)."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from ragen_core.reports import artifact_key, iteration_markdown


@task(name="publish_iteration_artifact", cache_policy=NO_CACHE)
def publish_iteration_artifact(run_id: str, iteration: int, metrics: dict[str, float]) -> str:
    """A markdown artifact of the iteration's metrics, one version per iteration under the run's key."""
    key = artifact_key(run_id)
    create_markdown_artifact(
        markdown=iteration_markdown(run_id, iteration, metrics),
        key=key,
        description=f"{run_id}: metrics of iteration {iteration}",
    )
    return key


@task(name="publish_table_artifact", cache_policy=NO_CACHE)
def publish_table_artifact(key: str, rows: list[dict], description: str) -> str:
    """A table artifact (e.g. a sweep's comparison)."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(table=rows, key=key, description=description)
    return key
