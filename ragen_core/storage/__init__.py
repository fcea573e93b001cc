"""Storage: the Parquet lake (commit protocol), row builders, DuckDB catalog, compaction and
housekeeping of whole runs."""

from ragen_core.storage.catalog import QueryRefused, check_read_only, connect, query
from ragen_core.storage.compaction import CompactionReport, compact_run
from ragen_core.storage.files import LakeError
from ragen_core.storage.housekeeping import (
    RemovalPlan,
    RunActiveError,
    RunNotFoundError,
    plan_removal,
    remove_run,
    runs_overview,
)
from ragen_core.storage.lake import DataLake, Stage
from ragen_core.storage.rows import checkpoint_row, evaluation_rows, event_row

__all__ = [
    "CompactionReport",
    "DataLake",
    "LakeError",
    "QueryRefused",
    "RemovalPlan",
    "RunActiveError",
    "RunNotFoundError",
    "Stage",
    "check_read_only",
    "checkpoint_row",
    "compact_run",
    "connect",
    "evaluation_rows",
    "event_row",
    "plan_removal",
    "query",
    "remove_run",
    "runs_overview",
]
