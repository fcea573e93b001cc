"""Table schemas (Arrow), data contracts (pandera), semantic suites (great-expectations) and the run manifest
(:mod:`schemas.manifest`, imported from there). Depends on nothing of ours."""

from schemas.tables import (
    CHECKPOINTS,
    EVALUATIONS,
    EVENTS,
    METRICS,
    RUNS,
    SCHEMA_VERSION,
    TABLES,
    TRAJECTORIES,
    TRAJECTORY_KEY,
    TURNS,
    ColumnSpec,
    TableSpec,
)
from schemas.versions import (
    UPGRADES,
    NewerSchemaError,
    SchemaVersionError,
    UpgradeRegistry,
    needs_function,
    upgrade_registry,
)

__all__ = [
    "CHECKPOINTS",
    "EVALUATIONS",
    "EVENTS",
    "METRICS",
    "RUNS",
    "SCHEMA_VERSION",
    "TABLES",
    "TRAJECTORIES",
    "TRAJECTORY_KEY",
    "TURNS",
    "UPGRADES",
    "ColumnSpec",
    "NewerSchemaError",
    "SchemaVersionError",
    "TableSpec",
    "UpgradeRegistry",
    "needs_function",
    "upgrade_registry",
]
