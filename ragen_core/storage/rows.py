"""Rows of the small tables (``evaluations``, ``checkpoints``, ``events``), ready for :meth:`DataLake.write_rows`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from schemas.tables import EVALUATIONS


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
