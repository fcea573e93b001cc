"""Reading files written with an older ``schema_version``: the upgrade rule.

Every file stores its table's ``schema_version`` in the Arrow schema metadata (files without it predate
versioning and count as version 1). A reader brings a version-``v`` table up to the current version ``V`` one step
at a time, ``v -> v+1 -> ... -> V``. Step ``s -> s+1``:

1. runs the upgrade function registered for ``(table, s)``, if any (renames, type changes, derived values);
2. adds every column introduced in version ``s+1`` that is still missing, filled with the column's ``default``
   (null when it has none; :class:`~schemas.tables.TableSpec` refuses a later non-nullable column without one).

Then the columns are put in the current order (columns dropped by later versions go) and cast to the current
schema. Most schema changes only add columns and need no function at all. A file newer than this code
(``v > V``) raises :class:`NewerSchemaError`: only a newer ragen-flows knows what its columns mean.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from ragen_core.registry import Registry
from schemas.tables import SCHEMA_VERSION, TableSpec

UpgradeFn = Callable[[pa.Table], pa.Table]


class SchemaVersionError(ValueError):
    """A stored table cannot be brought to the current schema."""


class NewerSchemaError(SchemaVersionError):
    """A stored table was written by a newer ragen-flows than the one reading it."""


UpgradeRegistry = Registry[UpgradeFn]
"""A :class:`~ragen_core.registry.Registry` of upgrade functions, named ``(table, from_version)``:
``@UPGRADES.register(("trajectories", 1))`` turns a version-1 trajectories table into a version-2 one."""


def upgrade_registry() -> UpgradeRegistry:
    """An empty registry of upgrade functions (the project's own is :data:`UPGRADES`; tests make their own)."""
    return Registry("schema upgrade")


UPGRADES = upgrade_registry()
"""The project's upgrade functions; register new ones next to the version bump in :mod:`schemas.tables`."""


def needs_function(registry: UpgradeRegistry, table: str, from_version: int, to_version: int) -> bool:
    """Whether any step between the two versions of ``table`` needs a registered function (not only added columns)."""
    return any((table, step) in registry for step in range(from_version, to_version))


def stored_version(schema: pa.Schema) -> int:
    """The ``schema_version`` a file was written with (1 when the file carries none)."""
    raw = (schema.metadata or {}).get(b"schema_version")
    if raw is None:
        return SCHEMA_VERSION
    try:
        return int(raw)
    except ValueError as exc:
        raise SchemaVersionError(f"schema_version {raw!r} is not an integer") from exc


def check_readable(spec: TableSpec, version: int) -> None:
    """Raise :class:`NewerSchemaError` when ``version`` is newer than this code knows for ``spec``."""
    if version > spec.version:
        raise NewerSchemaError(
            f"table {spec.name!r} was written with schema_version {version}, but this ragen-flows only knows "
            f"versions up to {spec.version}: upgrade ragen-flows (pip install -U ragen-flows) to read it"
        )


def add_new_columns(table: pa.Table, spec: TableSpec, version: int) -> pa.Table:
    """Add the columns introduced in ``version`` that ``table`` lacks, filled with their default (or null)."""
    for column in spec.columns:
        if column.added_in == version and column.name not in table.column_names:
            values = pa.array([column.default] * table.num_rows, type=column.type)
            table = table.append_column(pa.field(column.name, column.type, nullable=column.nullable), values)
    return table


def upgrade(table: pa.Table, spec: TableSpec, registry: UpgradeRegistry = UPGRADES) -> pa.Table:
    """``table`` (any known version of ``spec``) in the current schema, by the rule in this module's docstring."""
    stored_table = (table.schema.metadata or {}).get(b"table")
    if stored_table is not None and stored_table.decode() != spec.name:
        raise SchemaVersionError(f"the file holds table {stored_table.decode()!r}, not {spec.name!r}")
    version = stored_version(table.schema)
    check_readable(spec, version)
    for step in range(version, spec.version):
        if (spec.name, step) in registry:
            table = registry.get((spec.name, step))(table)
        table = add_new_columns(table, spec, step + 1)
    missing = [name for name in spec.column_names if name not in table.column_names]
    if missing:
        raise SchemaVersionError(
            f"a schema_version {version} {spec.name!r} table lacks columns {missing} (current version {spec.version})"
        )
    try:
        return table.select(spec.column_names).cast(spec.arrow_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as exc:  # nulls in NOT NULL
        raise SchemaVersionError(
            f"a schema_version {version} {spec.name!r} table does not cast to the current schema: {exc}"
        ) from exc
