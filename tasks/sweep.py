"""Sweep tasks: record a plan and compare its points (thin wrappers over ragen_core.sweep)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen_core import sweep as s
from ragen_core.storage import DataLake


@task(name="record_sweep", cache_policy=NO_CACHE)
def record_sweep(lake: DataLake, plan: s.SweepPlan) -> None:
    """Store a plan (its points validated when it was made) under the data root."""
    s.record_sweep(lake, plan)


@task(name="compare_sweep", cache_policy=NO_CACHE)
def compare_sweep(lake: DataLake, plan: s.SweepPlan) -> list[dict[str, Any]]:
    """The comparison table of the sweep's points (validation success, final reward, collapse events)."""
    return s.compare_sweep(lake, plan).to_pylist()
