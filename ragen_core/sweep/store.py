"""A sweep under the data root: its plan stored and read back (:func:`record_sweep`, :func:`read_sweep`), and its
points compared from the lake's tables (:func:`compare_sweep`)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from ragen_core.config import ConfigError
from ragen_core.run.checks import StoredConfig, build_stored_run_config
from ragen_core.storage import DataLake, query
from ragen_core.storage.files import atomic_write_bytes
from ragen_core.storage.storecopy import share
from ragen_core.sweep.plan import SweepError, SweepPlan, SweepPoint, _check_id


def sweep_file(lake: DataLake, sweep_id: str) -> Path:
    """Where a sweep's plan is stored (the lake's sweep folder)."""
    return lake.sweep_file(_check_id(sweep_id))


def record_sweep(lake: DataLake, plan: SweepPlan) -> Path:
    """Store the plan (atomically). The same id with another spec is refused: the runs would mix two sweeps."""
    path = sweep_file(lake, plan.sweep_id)
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("spec") != plan.spec:
            raise SweepError(
                f"sweep id {plan.sweep_id!r} already names another sweep in {lake.root} (different base config, "
                "search or seeds); choose another --sweep-id, or drop --sweep-id to get one derived from the spec"
            )
        return path
    atomic_write_bytes(path, (json.dumps(plan.to_dict(), indent=1, sort_keys=True) + "\n").encode())
    share(lake.root)  # a data root in a bucket: the plan there before any point runs (another host checks it)
    return path


def read_sweep(lake: DataLake, sweep_id: str, trusted_kinds: frozenset[str] = frozenset()) -> SweepPlan:
    """The stored plan of ``sweep_id``, its points' configs built as configs read from the data root are: a program or
    outside folder one names is refused (:func:`ragen_core.run.checks.build_stored_run_config`), as
    :class:`SweepError` (``trusted_kinds``: kinds of keys the user allows, ``{"module"}`` for the environments'
    modules)."""
    path = sweep_file(lake, sweep_id)
    if not path.is_file():
        raise SweepError(f"no sweep {sweep_id!r} in {lake.root} (looked for {path})")
    stored = json.loads(path.read_text())
    source = str(path.relative_to(lake.root))
    try:
        points = [
            SweepPoint(
                p["index"],
                p["run_id"],
                p["overrides"],
                build_stored_run_config(StoredConfig(p["config"], source, lake.root), [], trusted_kinds),
            )
            for p in stored["points"]
        ]
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    return SweepPlan(stored["sweep_id"], stored["spec"], points)


COMPARISON_SQL = """
WITH finals AS (
    SELECT run_id, max(iteration) AS last_iteration FROM metrics GROUP BY run_id
), validation AS (
    SELECT e.run_id, avg(e.success_rate) AS val_success
    FROM evaluations e JOIN finals f ON e.run_id = f.run_id AND e.iteration = f.last_iteration
    GROUP BY e.run_id
), first_validation AS (
    SELECT run_id, avg(success_rate) AS val_success_first
    FROM evaluations WHERE iteration = 0 GROUP BY run_id
), rewards AS (
    SELECT run_id, arg_max(value, iteration) AS final_reward
    FROM metrics WHERE name = 'rollout/reward_mean' GROUP BY run_id
), collapse AS (
    SELECT run_id, count(*) AS collapse_events FROM events WHERE kind = 'early_warning' GROUP BY run_id
)
SELECT r.run_id, r.sweep_point AS point, r.status, r.iterations_done, v0.val_success_first, v.val_success,
       w.final_reward, coalesce(c.collapse_events, 0) AS collapse_events
FROM runs r
LEFT JOIN validation v USING (run_id)
LEFT JOIN first_validation v0 USING (run_id)
LEFT JOIN rewards w USING (run_id)
LEFT JOIN collapse c USING (run_id)
WHERE r.sweep_id = $sweep_id
"""

COMPARISON_TABLES = ("runs", "metrics", "evaluations", "events")  # the tables it reads: views of these alone

COMPARISON_SCHEMA = pa.schema(
    [
        ("point", pa.int32()),
        ("run_id", pa.string()),
        ("overrides", pa.string()),
        ("status", pa.string()),
        ("iterations_done", pa.int32()),
        ("val_success_first", pa.float64()),
        ("val_success", pa.float64()),
        ("final_reward", pa.float64()),
        ("collapse_events", pa.int64()),
    ]
)


def compare_sweep(lake: DataLake, plan: SweepPlan) -> pa.Table:
    """One row per point: status, validation success before RL (iteration 0) and at the last committed iteration
    (mean over the validation envs), the last training iteration's mean reward, and Echo-Trap warnings.

    Points that never started have status ``pending`` and nulls."""
    stored = query(lake, COMPARISON_SQL, params={"sweep_id": plan.sweep_id}, tables=COMPARISON_TABLES)
    found = {row["run_id"]: row for row in stored.to_pylist()}
    rows = []
    for point in plan.points:
        row = found.get(point.run_id, {})
        rows.append(
            {
                "point": point.index,
                "run_id": point.run_id,
                "overrides": " ".join(point.overrides),
                "status": row.get("status", "pending"),
                "iterations_done": row.get("iterations_done", 0),
                "val_success_first": row.get("val_success_first"),
                "val_success": row.get("val_success"),
                "final_reward": row.get("final_reward"),
                "collapse_events": row.get("collapse_events", 0),
            }
        )
    return pa.Table.from_pylist(rows, schema=COMPARISON_SCHEMA)
