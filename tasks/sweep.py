"""Sweep tasks: plan (validate every point, store the plan), record a plan made before, and compare (thin wrappers
over ragen_core.sweep)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen_core import sweep as s
from ragen_core.config import RunConfig
from ragen_core.storage import DataLake


@task(name="plan_sweep", cache_policy=NO_CACHE)
def plan_sweep(lake: DataLake, base: RunConfig | dict[str, Any], grid: list[str], random: list[str], samples: int,
               seeds: Any, sweep_id: str | None, search_seed: int,
               max_points: int = s.DEFAULT_MAX_POINTS) -> s.SweepPlan:  # fmt: skip
    """Expand the search into points (every point's config validated) and store the plan under the data root."""
    plan = s.plan_sweep(base, grid, random, samples, seeds, sweep_id, search_seed, max_points)
    s.record_sweep(lake, plan)
    return plan


@task(name="record_sweep", cache_policy=NO_CACHE)
def record_sweep(lake: DataLake, plan: s.SweepPlan) -> None:
    """Store a plan the caller made (its points validated then) under the data root."""
    s.record_sweep(lake, plan)


@task(name="compare_sweep", cache_policy=NO_CACHE)
def compare_sweep(lake: DataLake, plan: s.SweepPlan) -> list[dict[str, Any]]:
    """The comparison table of the sweep's points (validation success, final reward, collapse events)."""
    return s.compare_sweep(lake, plan).to_pylist()
