import pyarrow as pa
import pytest

from schemas.tables import METRICS, TABLES, ColumnSpec, TableSpec
from schemas.versions import (
    NewerSchemaError,
    SchemaVersionError,
    needs_function,
    stored_version,
    upgrade,
    upgrade_registry,
)

EXPECTED_TABLES = {"trajectories", "turns", "metrics", "evaluations", "runs", "checkpoints", "events"}


def _metrics_v2(**extra) -> TableSpec:
    return TableSpec(
        "metrics",
        METRICS.columns
        + (
            ColumnSpec("unit", pa.string(), "Unit of the value.", nullable=True, added_in=2),
            ColumnSpec("step", pa.int64(), "Optimizer step.", added_in=2, default=0),
        ),
        key=METRICS.key,
        version=2,
        **extra,
    )


def _v1_metrics() -> pa.Table:
    rows = [{"run_id": "r", "iteration": 0, "name": "a", "value": 1.0}]
    return pa.Table.from_pylist(rows, schema=METRICS.arrow_schema_at(1))


def test_every_table_is_versioned_and_every_column_described():
    assert set(TABLES) == EXPECTED_TABLES
    for spec in TABLES.values():
        schema = spec.arrow_schema
        assert schema.metadata[b"schema_version"] == str(spec.version).encode()
        assert schema.metadata[b"table"] == spec.name.encode() and schema.metadata[b"description"]
        for field in schema:
            assert field.metadata[b"description"], (spec.name, field.name)
        assert set(spec.key) <= set(spec.column_names)


def test_a_column_added_later_must_be_nullable_or_have_a_default():
    late = ColumnSpec("late", pa.int32(), "Added in version 2, not nullable.", added_in=2)
    with pytest.raises(ValueError, match="make it nullable or give it a default"):
        TableSpec("t", (ColumnSpec("a", pa.int32(), "A."), late), key=("a",), version=2)
    with pytest.raises(ValueError, match="added_in=3 outside 1..2"):
        TableSpec("t", (ColumnSpec("a", pa.int32(), "A.", added_in=3),), key=("a",), version=2)


def test_columns_at_an_older_version():
    spec = _metrics_v2()
    assert spec.arrow_schema_at(1).names == ["run_id", "iteration", "name", "value"]
    assert spec.arrow_schema.names == ["run_id", "iteration", "name", "value", "unit", "step"]
    assert stored_version(spec.arrow_schema_at(1)) == 1 and stored_version(spec.arrow_schema) == 2
    assert stored_version(pa.schema([pa.field("x", pa.int32())])) == 1  # no metadata: predates versioning


def test_upgrade_fills_added_columns_with_null_or_default():
    upgraded = upgrade(_v1_metrics(), _metrics_v2())
    assert upgraded.schema.equals(_metrics_v2().arrow_schema, check_metadata=True)
    expected = {"run_id": "r", "iteration": 0, "name": "a", "value": 1.0, "unit": None, "step": 0}
    assert upgraded.to_pylist() == [expected]


def test_registered_functions_run_before_the_added_columns():
    registry = upgrade_registry()

    @registry.register(("metrics", 1))
    def scale(table: pa.Table) -> pa.Table:
        return table.set_column(3, "value", pa.array([v * 100 for v in table["value"].to_pylist()]))

    assert upgrade(_v1_metrics(), _metrics_v2(), registry)["value"].to_pylist() == [100.0]
    assert needs_function(registry, "metrics", 1, 2) and not needs_function(registry, "metrics", 2, 2)
    with pytest.raises(ValueError, match=r"schema upgrade \('metrics', 1\) is registered twice"):
        registry.register(("metrics", 1))(scale)


def test_a_newer_version_asks_to_upgrade_ragen_flows():
    newer = upgrade(_v1_metrics(), _metrics_v2())
    with pytest.raises(NewerSchemaError, match=r"schema_version 2.*upgrade ragen-flows"):
        upgrade(newer, METRICS)


def test_a_foreign_table_or_missing_column_is_refused():
    with pytest.raises(SchemaVersionError, match="holds table 'metrics', not 'turns'"):
        upgrade(_v1_metrics(), TABLES["turns"])
    with pytest.raises(SchemaVersionError, match=r"lacks columns \['value'\]"):
        upgrade(_v1_metrics().drop_columns(["value"]), METRICS)
