"""Rows of the small tables (``evaluations``, ``checkpoints``, ``events``), ready for :meth:`DataLake.write_rows`,
and what it does with rows it is given: an Arrow table of the table's schema, every row in its partition."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ragen_core.storage.files import LakeError
from schemas.tables import EVALUATIONS, TableSpec

Rows = pa.Table | Sequence[Mapping[str, Any]]


def utc_timestamp() -> datetime:
    return datetime.now(timezone.utc)


def evaluation_rows(trajectories: pa.Table) -> pa.Table:
    """One ``evaluations`` row per (run, iteration, env) of the ``split='val'`` rows in ``trajectories``.

    ``instances`` counts groups, ``k`` is the group size (the largest, should sizes differ), ``pass_at_k`` the
    share of groups with at least one success; ``temperature`` is the rows' sampling temperature (the first).
    """
    columns = ["run_id", "iteration", "split", "env", "group_id", "success", "total_reward", "response_length"]
    frame = trajectories.select(columns + ["temperature"]).to_pandas()
    frame = frame[frame["split"] == "val"]
    rows = []
    for (run_id, iteration, env), rows_of_env in frame.groupby(["run_id", "iteration", "env"], sort=True):
        groups = rows_of_env.groupby("group_id")
        rows.append(
            {
                "run_id": run_id,
                "iteration": int(iteration),
                "env": env,
                "instances": int(groups.ngroups),
                "k": int(groups.size().max()),
                "temperature": float(rows_of_env["temperature"].iloc[0]),
                "success_rate": float(rows_of_env["success"].mean()),
                "pass_at_k": float(groups["success"].any().mean()),
                "reward_mean": float(rows_of_env["total_reward"].mean()),
                "response_length_mean": float(rows_of_env["response_length"].mean()),
            }
        )
    return pa.Table.from_pylist(rows, schema=EVALUATIONS.arrow_schema)


def checkpoint_row(
    run_id: str,
    iteration: int,
    path: str,
    checkpoint_format: str,
    metrics: dict[str, float],
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """A ``checkpoints`` row; ``checkpoint_format`` is ``deepspeed`` or ``hf``."""
    return {
        "run_id": run_id,
        "iteration": iteration,
        "format": checkpoint_format,
        "path": str(path),
        "metrics_json": json.dumps(metrics, sort_keys=True, default=float),
        "created_at": created_at or utc_timestamp(),
    }


def event_row(
    run_id: str,
    iteration: int,
    kind: str,
    message: str,
    metric: str | None = None,
    value: float | None = None,
    threshold: float | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """An ``events`` row, e.g. ``event_row(run, 7, "early_warning", "in-group reward std collapsed",
    "rollout/in_group_reward_std", 0.01, 0.05)``."""
    return {
        "run_id": run_id,
        "iteration": iteration,
        "kind": kind,
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "message": message,
        "created_at": created_at or utc_timestamp(),
    }


def rows_table(spec: TableSpec, rows: Rows) -> pa.Table:
    """``rows`` as an Arrow table of ``spec``'s schema (a table is taken as it is); a :class:`LakeError` when they
    do not fit."""
    if isinstance(rows, pa.Table):
        return rows
    try:
        return pa.Table.from_pylist(list(rows), schema=spec.arrow_schema)
    except (pa.ArrowException, TypeError, ValueError, KeyError) as exc:
        raise LakeError(f"rows do not fit table {spec.name!r} ({', '.join(spec.column_names)}): {exc}") from exc


def check_partition(data: pa.Table, run_id: str, iteration: int, table: str, report: Any) -> None:
    """Every row must belong to the partition it is written to (the files are self-describing)."""
    for column, expected in (("run_id", run_id), ("iteration", iteration)):
        if column not in data.column_names:
            continue
        values = data[column]
        try:
            wrong = pc.invert(pc.fill_null(pc.equal(values, pa.scalar(expected, values.type)), False))
        except (pa.ArrowException, TypeError):
            continue  # a wrongly typed column: the structure checks report it
        if pc.any(wrong).as_py():
            rows = [{"row": i} for i, bad in enumerate(wrong.to_pylist()) if bad]
            report.add("lake", f"{table}:partition", column, rows, f"rows outside partition {run_id}/{iteration}")
