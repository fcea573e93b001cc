"""Storage: the Parquet lake (commit protocol), record conversion, DuckDB catalog."""

from ragen_core.storage.catalog import connect, query
from ragen_core.storage.lake import DataLake, LakeError
from ragen_core.storage.records import BatchMeta, trajectories_table, turns_table

__all__ = ["BatchMeta", "DataLake", "LakeError", "connect", "query", "trajectories_table", "turns_table"]
