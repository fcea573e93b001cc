"""DuckDB over the lake: one view per table across every run (``SELECT ... FROM trajectories``)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from ragen_core.storage.lake import DataLake
from schemas import TABLES


def connect(root: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per table over the published Parquet files of ``root``.

    Tables with no files yet are empty views with the right columns, so queries never fail on a fresh root.
    """
    lake = DataLake(root)
    con = duckdb.connect(":memory:")
    for name, spec in TABLES.items():
        if lake.partition_files(name):
            pattern = str(lake.table_dir(name) / "run_id=*" / "iteration=*" / "part-*.parquet").replace("'", "''")
            con.execute(
                f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{pattern}', union_by_name=true, "
                "hive_partitioning=false)"
            )
        else:
            empty = spec.arrow_schema.empty_table()
            con.register(f"_{name}_empty", empty)
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
    return con


def query(root: str | Path, sql: str) -> pa.Table:
    """Run ``sql`` against the lake at ``root`` and return the result as an Arrow table."""
    con = connect(root)
    try:
        relation = con.sql(sql)
        return relation.to_arrow_table() if relation is not None else pa.table({})
    finally:
        con.close()
