"""Table schemas (Arrow), data contracts (pandera) and semantic suites (great-expectations). Depends on nothing of
ours."""

from schemas.tables import METRICS, SCHEMA_VERSION, TABLES, TRAJECTORIES, TRAJECTORY_KEY, TURNS, ColumnSpec, TableSpec

__all__ = ["METRICS", "SCHEMA_VERSION", "TABLES", "TRAJECTORIES", "TRAJECTORY_KEY", "TURNS", "ColumnSpec", "TableSpec"]
