"""Storage: the Parquet lake (commit protocol), record conversion, row builders, DuckDB catalog."""

from ragen_core.storage.catalog import connect, query
from ragen_core.storage.files import LakeError
from ragen_core.storage.lake import DataLake
from ragen_core.storage.records import BatchMeta, trajectories_table, turns_table
from ragen_core.storage.rows import checkpoint_row, evaluation_rows, event_row

__all__ = [
    "BatchMeta",
    "DataLake",
    "LakeError",
    "checkpoint_row",
    "connect",
    "evaluation_rows",
    "event_row",
    "query",
    "trajectories_table",
    "turns_table",
]
