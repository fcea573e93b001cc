"""Files written with an older schema_version read back in the current schema (lake reader and DuckDB views);
files from a newer ragen-flows are refused with a clear message."""

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragen_core.storage import DataLake, LakeError, connect, query
from schemas import METRICS, TABLES, ColumnSpec, TableSpec, upgrade_registry

UNIT = ColumnSpec("unit", pa.string(), "Unit of the value.", nullable=True, added_in=2)
STEP = ColumnSpec("step", pa.int64(), "Optimizer step.", added_in=2, default=0)
METRICS_V2 = TableSpec("metrics", METRICS.columns + (UNIT, STEP), key=METRICS.key, version=2)


def _rows(iteration: int, **extra) -> list[dict]:
    return [{"run_id": "run-a", "iteration": iteration, "name": "loss", "value": 0.5, **extra}]


@pytest.fixture()
def old_and_new(tmp_path):
    """Iteration 0 written by today's code (metrics v1), iteration 1 by a later one (metrics v2)."""
    old = DataLake(tmp_path)
    old.write_rows("metrics", "run-a", 0, _rows(0), stage="commit")
    new = DataLake(tmp_path, tables={**TABLES, "metrics": METRICS_V2})
    new.write_rows("metrics", "run-a", 1, _rows(1, unit="nats", step=12), stage="commit")
    return old, new


def test_the_reader_fills_columns_added_later(old_and_new):
    _, new = old_and_new
    (v1_file,) = new.partition_files("metrics", "run-a", 0)
    assert pq.read_schema(v1_file).names == ["run_id", "iteration", "name", "value"]  # really an older file
    table = new.read_table("metrics")
    assert table.schema.equals(METRICS_V2.arrow_schema, check_metadata=True)
    assert [(r["iteration"], r["unit"], r["step"]) for r in table.to_pylist()] == [(0, None, 0), (1, "nats", 12)]


def test_duckdb_views_apply_the_same_rule(old_and_new):
    _, new = old_and_new
    rows = query(new, "SELECT iteration, unit, step FROM metrics ORDER BY iteration").to_pylist()
    assert rows == [{"iteration": 0, "unit": None, "step": 0}, {"iteration": 1, "unit": "nats", "step": 12}]
    described = [row[0] for row in connect(new).execute("DESCRIBE metrics").fetchall()]
    assert described == METRICS_V2.column_names


def test_only_old_files_still_give_every_current_column(tmp_path):
    DataLake(tmp_path).write_rows("metrics", "run-a", 0, _rows(0), stage="commit")
    new = DataLake(tmp_path, tables={**TABLES, "metrics": METRICS_V2})
    assert query(new, "SELECT unit, step FROM metrics").to_pylist() == [{"unit": None, "step": 0}]


def test_a_registered_upgrade_function_is_applied_by_the_reader_and_the_views(old_and_new):
    old, _ = old_and_new
    renamed = tuple(ColumnSpec("metric", c.type, c.description) if c.name == "name" else c for c in METRICS_V2.columns)
    metrics_v3 = TableSpec("metrics", renamed, key=("run_id", "iteration", "metric"), version=3)
    registry = upgrade_registry()
    registry.register(("metrics", 2))(
        lambda table: table.rename_columns(["metric" if n == "name" else n for n in table.column_names])
    )
    v3 = DataLake(old.root, tables={**TABLES, "metrics": metrics_v3}, upgrades=registry)
    expected = [{"iteration": 0, "metric": "loss", "step": 0}, {"iteration": 1, "metric": "loss", "step": 12}]
    assert v3.read_table("metrics").select(["iteration", "metric", "step"]).to_pylist() == expected
    assert query(v3, "SELECT iteration, metric, step FROM metrics ORDER BY iteration").to_pylist() == expected


def test_a_file_from_a_newer_ragen_flows_is_refused_with_a_clear_message(old_and_new):
    old, new = old_and_new
    (v2_file,) = new.partition_files("metrics", "run-a", 1)
    message = rf"'{re.escape(str(v2_file))}'.*schema_version 2.*only knows versions up to 1.*upgrade ragen-flows"
    with pytest.raises(LakeError, match=message):
        old.read_table("metrics")
    with pytest.raises(LakeError, match=message):
        query(old.root, "SELECT * FROM metrics")
    assert query(old.root, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 0}]


def test_a_file_without_a_schema_version_counts_as_version_1(tmp_path):
    lake = DataLake(tmp_path)
    folder = lake.partition_dir("metrics", "run-a", 0)
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_rows(0)), folder / "part-legacy-00000.parquet")
    assert lake.read_table("metrics").to_pylist() == _rows(0)
    new = DataLake(tmp_path, tables={**TABLES, "metrics": METRICS_V2})
    rows = query(new, "SELECT name, unit, step FROM metrics").to_pylist()
    assert rows == [{"name": "loss", "unit": None, "step": 0}]
