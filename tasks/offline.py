"""Offline re-training steps as Prefect tasks (thin wrappers over :mod:`ragen_core.run.offline`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from ragen_core.policy import load_tokenizer
from ragen_core.run import offline
from ragen_core.run.session import RunSession
from ragen_core.storage import DataLake


@task(name="resolve_init", cache_policy=NO_CACHE)
def resolve_init(init: str, lake: DataLake) -> Path:
    """The model folder to start from (a model dir, a checkpoint's hf export, or run:<id>[@<updates>])."""
    return offline.resolve_init(init, lake)


@task(name="select_trajectories", cache_policy=NO_CACHE)
def select_trajectories(lake: DataLake, sql: str) -> pa.Table:
    """The stored trajectories the query selects, whole."""
    return offline.select_trajectories(lake, sql)


@task(name="check_tokenizer", cache_policy=NO_CACHE)
def check_tokenizer(lake: DataLake, table: pa.Table, model_dir: Path) -> str:
    """Refuse rows tokenised by another tokenizer than the model's."""
    return offline.check_tokenizer(lake, sorted(set(table["run_id"].to_pylist())), load_tokenizer(model_dir))


@task(name="lineage", cache_policy=NO_CACHE)
def lineage(sql: str, table: pa.Table, mode: str, init: Path, lake: DataLake | None = None) -> dict[str, Any]:
    """The query, source runs and start model of the re-trained run (and the run whose checkpoint that is)."""
    return offline.lineage(sql, table, mode, init, lake)


@task(name="offline_epoch", task_run_name="epoch-i{epoch}", cache_policy=NO_CACHE)
def offline_epoch(session: RunSession, table: pa.Table, mode: str, epoch: int) -> dict[str, float]:
    """One pass of sft or pg over the selected rows."""
    return offline.offline_epoch(session, table, mode, epoch)
