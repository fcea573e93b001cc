"""The ``runs`` table, derived from the run manifests (``runs/<run_id>/manifest.json``) and commit markers.

Why derived and not written as Parquet: a manifest changes while its run is alive (status, ``updated_at``,
``last_committed_iteration``); it is written atomically and is the one source of truth, so a Parquet copy could
only go stale. Reading a few JSON files per query costs milliseconds.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from schemas.manifest import RunManifest
from schemas.tables import RUNS


def _timestamp(value: Any) -> datetime | None:
    if value is None:
        return None
    stamp = datetime.fromisoformat(str(value))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def manifest_row(manifest: RunManifest, committed: list[int]) -> dict[str, Any]:
    """One ``runs`` row from a manifest and the run's committed iterations.

    ``kind`` defaults to ``train`` (training manifests do not name it); ``created_at`` is the manifest's
    ``created_at``, else ``started_at``, else ``updated_at`` (bootstrap manifests are written once, when done).
    Sweep points carry ``sweep: {id, point, overrides}``; offline runs their ``lineage`` (:func:`lineage_columns`).
    """
    updated = _timestamp(manifest.updated_at)
    sweep = manifest.sweep or {}
    created = _timestamp(manifest.created_at or manifest.started_at) or updated
    if created is None:
        raise ValueError("the manifest has none of created_at, started_at, updated_at")
    return {
        "run_id": manifest.run_id,
        "kind": manifest.kind,
        "status": manifest.status,
        "config_json": json.dumps(manifest.config or {}, sort_keys=True, default=str),
        "config_hash": manifest.config_hash or "",
        "seed": manifest.seed if manifest.seed is not None else (manifest.config or {}).get("seed"),
        "versions_json": json.dumps(manifest.versions or {}, sort_keys=True),
        "git_commit": manifest.git_commit,
        "model_dir": manifest.model_dir,
        "created_at": created,
        "updated_at": updated or created,
        "iterations_done": len(committed),
        "last_committed_iteration": max(committed) if committed else None,
        "error": manifest.error,
        "sweep_id": sweep.get("id"),
        "sweep_point": sweep.get("point"),
        "overrides_json": json.dumps(sweep["overrides"]) if "overrides" in sweep else None,
        **lineage_columns(manifest),
    }


def lineage_columns(manifest: RunManifest) -> dict[str, Any]:
    """The lineage columns of a run: what an offline run (``ragen retrain``) was trained on and from, as its
    manifest's ``lineage`` records it (:func:`ragen_core.run.offline.lineage`); nulls for every other run."""
    lineage = manifest.lineage or {}
    sources = lineage.get("source_iterations")
    return {
        "offline_mode": lineage.get("mode"),
        "source_query": lineage.get("query"),
        "source_runs": lineage.get("source_runs"),
        "source_iterations": (
            [{"run_id": run, "iterations": list(its)} for run, its in sorted(sources.items())] if sources else None
        ),
        "source_trajectories": lineage.get("trajectories"),
        "init_model": lineage.get("init"),
        "init_run": lineage.get("init_run"),
        "init_iteration": lineage.get("init_iteration"),
    }


def runs_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The ``runs`` table of the given rows (sorted by run id)."""
    return pa.Table.from_pylist(sorted(rows, key=lambda r: r["run_id"]), schema=RUNS.arrow_schema)
