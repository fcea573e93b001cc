"""Storage: the Parquet lake (commit protocol, the read path), row builders and the DuckDB catalog.

Its maintenance wing, :mod:`ragen_core.storage.maintenance` (compaction, removal of whole runs, the layout upgrade,
the dataset export, space), works on a lake from outside: nothing here imports it."""

from ragen_core.storage.catalog import QueryRefused, check_read_only, connect, query
from ragen_core.storage.files import LakeError
from ragen_core.storage.lake import DataLake, Stage
from ragen_core.storage.rows import checkpoint_row, evaluation_rows, event_row
from ragen_core.storage.running import QueryError, QueryTimeout

__all__ = [
    "DataLake",
    "LakeError",
    "QueryError",
    "QueryRefused",
    "QueryTimeout",
    "Stage",
    "check_read_only",
    "checkpoint_row",
    "connect",
    "evaluation_rows",
    "event_row",
    "query",
]
