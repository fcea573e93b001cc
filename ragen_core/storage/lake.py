"""The trajectory lake on disk: all Parquet reading and writing, and the commit protocol (DESIGN.md).

Layout under the data root::

    <table>/run_id=<id>/iteration=<n>/part-<stage>-<k>.parquet    published rows (what readers see)
    _staging/<run_id>/<iteration>/<stage>/<table>/...              a stage's output before publishing
    _staging/<run_id>/<iteration>/<stage>/_DONE.json               the stage finished (its result payload)
    _commits/<run_id>/iteration=<n>.json                           the iteration is committed
    quarantine/run_id=<id>/iteration=<n>/<stage>/                  batches that failed validation + report.json
    runs/<run_id>/manifest.json                                    the run manifest

File names are deterministic (run, iteration, stage, part), so a redone stage overwrites instead of adding rows.
Every file is written under a temporary name and renamed into place, so readers never see a partial file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from schemas import TABLES


class LakeError(RuntimeError):
    """A stored file cannot be read or the lake is in a state the caller did not expect."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` atomically."""
    _atomic_write_bytes(Path(path), json.dumps(payload, indent=2, sort_keys=True, default=str).encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    """Write ``table`` to ``path`` atomically (temporary name, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_parquet(path: Path) -> pa.Table:
    """Read one Parquet file; a damaged file raises :class:`LakeError` naming it."""
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise LakeError(f"cannot read Parquet file {str(path)!r} (damaged or truncated?): {exc}") from exc


class DataLake:
    """Paths and atomic I/O of one data root."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    # -- paths -------------------------------------------------------------------------------------------------
    def table_dir(self, table: str) -> Path:
        return self.root / table

    def partition_dir(self, table: str, run_id: str, iteration: int) -> Path:
        return self.root / table / f"run_id={run_id}" / f"iteration={iteration}"

    def stage_dir(self, run_id: str, iteration: int, stage: str) -> Path:
        return self.root / "_staging" / run_id / str(iteration) / stage

    def commit_marker(self, run_id: str, iteration: int) -> Path:
        return self.root / "_commits" / run_id / f"iteration={iteration}.json"

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def models_dir(self) -> Path:
        return self.root / "models"

    # -- staging -----------------------------------------------------------------------------------------------
    def stage_table(self, run_id: str, iteration: int, stage: str, table: str, data: pa.Table, part: int = 0) -> Path:
        """Write a stage's output table into staging under a deterministic name."""
        expected = TABLES[table].arrow_schema
        if not data.schema.equals(expected, check_metadata=False):
            raise LakeError(f"table {table!r} does not match its schema:\n{data.schema}\nexpected:\n{expected}")
        path = self.stage_dir(run_id, iteration, stage) / table / f"part-{stage}-{part:05d}.parquet"
        atomic_write_parquet(path, data.replace_schema_metadata(expected.metadata))
        return path

    def read_staged(self, run_id: str, iteration: int, stage: str, table: str) -> pa.Table:
        """All staged parts of ``table`` for a stage, concatenated."""
        files = sorted((self.stage_dir(run_id, iteration, stage) / table).glob("part-*.parquet"))
        if not files:
            raise LakeError(f"stage {stage!r} of {run_id}/{iteration} has no staged {table!r} rows")
        return pa.concat_tables([read_parquet(f) for f in files])

    def mark_stage_done(self, run_id: str, iteration: int, stage: str, payload: dict[str, Any] | None = None) -> None:
        atomic_write_json(self.stage_dir(run_id, iteration, stage) / "_DONE.json", payload or {})

    def stage_result(self, run_id: str, iteration: int, stage: str) -> dict[str, Any] | None:
        """The payload of a finished stage, or None if the stage has not finished."""
        marker = self.stage_dir(run_id, iteration, stage) / "_DONE.json"
        return json.loads(marker.read_text()) if marker.is_file() else None

    def publish(self, run_id: str, iteration: int, stage: str) -> list[Path]:
        """Move a stage's staged files into the table partitions (one atomic rename per file)."""
        source = self.stage_dir(run_id, iteration, stage)
        published = []
        for table_dir in sorted(p for p in source.iterdir() if p.is_dir()) if source.is_dir() else []:
            target_dir = self.partition_dir(table_dir.name, run_id, iteration)
            target_dir.mkdir(parents=True, exist_ok=True)
            for file in sorted(table_dir.glob("part-*.parquet")):
                os.replace(file, target_dir / file.name)
                published.append(target_dir / file.name)
        return published

    def quarantine(self, run_id: str, iteration: int, stage: str, report_json: str) -> Path:
        """Move a failed stage's staged output under ``quarantine/`` with its report; return the folder."""
        target = self.root / "quarantine" / f"run_id={run_id}" / f"iteration={iteration}" / stage
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = self.stage_dir(run_id, iteration, stage)
        if source.is_dir():
            os.replace(source, target)
        _atomic_write_bytes(target / "report.json", report_json.encode())
        return target

    # -- reading published rows --------------------------------------------------------------------------------
    def partition_files(self, table: str, run_id: str | None = None, iteration: int | None = None) -> list[Path]:
        run_glob = f"run_id={run_id}" if run_id is not None else "run_id=*"
        iteration_glob = f"iteration={iteration}" if iteration is not None else "iteration=*"
        return sorted(self.table_dir(table).glob(f"{run_glob}/{iteration_glob}/part-*.parquet"))

    def read_table(self, table: str, run_id: str | None = None, iteration: int | None = None) -> pa.Table:
        """Published rows of ``table`` (optionally one run / one iteration), in the table's schema."""
        files = self.partition_files(table, run_id, iteration)
        schema = TABLES[table].arrow_schema
        if not files:
            return schema.empty_table()
        return pa.concat_tables([read_parquet(f).cast(schema) for f in files])

    # -- commits and manifest ----------------------------------------------------------------------------------
    def commit_iteration(self, run_id: str, iteration: int, payload: dict[str, Any]) -> None:
        """Mark the iteration committed, then drop its staging folder."""
        atomic_write_json(self.commit_marker(run_id, iteration), payload)
        shutil.rmtree(self.root / "_staging" / run_id / str(iteration), ignore_errors=True)

    def committed_iterations(self, run_id: str) -> list[int]:
        folder = self.root / "_commits" / run_id
        return sorted(int(p.stem.split("=")[1]) for p in folder.glob("iteration=*.json")) if folder.is_dir() else []

    def write_manifest(self, run_id: str, manifest: dict[str, Any]) -> None:
        atomic_write_json(self.run_dir(run_id) / "manifest.json", manifest)

    def read_manifest(self, run_id: str) -> dict[str, Any] | None:
        path = self.run_dir(run_id) / "manifest.json"
        return json.loads(path.read_text()) if path.is_file() else None
