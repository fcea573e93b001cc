"""TensorBoard view of the ``metrics`` table: each committed iteration's metrics as scalars of one event file.

Layout: the run's :meth:`~ragen_core.storage.DataLake.tensorboard_dir` (``runs/<run_id>/tensorboard/``) holds
``events.out.tfevents.<iteration:010d>.ragen`` — one file per committed iteration (step = iteration, tag = metric
name), written whole under a temporary name (which TensorBoard does not list) and renamed into place, so a killed
process never leaves a half-written event file and no file handle outlives the call. TensorBoard merges the files of
a folder; the names sort in step order, and writing an iteration again replaces its file instead of doubling its
points. The lake stays the source of truth: the files are written after the commit marker and
:func:`rebuild_tensorboard` regenerates them from the ``metrics`` table.
"""

from __future__ import annotations

import io
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

from ragen_core.storage import DataLake, LakeError
from ragen_core.storage.files import fsync_dir

LOGGER = logging.getLogger("ragen.monitor")
FILE_VERSION = "brain.Event:2"  # TensorBoard's current event format: restarts are marked, never guessed from steps


def event_file_name(iteration: int) -> str:
    """Deterministic name of ``iteration``'s event file; zero-padded so names sort in step order."""
    return f"events.out.tfevents.{iteration:010d}.ragen"


def event_file_bytes(step: int, scalars: Mapping[str, float], wall_time: float) -> bytes:
    """A complete event file: the file-version record, then one event with every scalar (float32, as TensorBoard
    stores them) at ``step``. Records are framed as TFRecords (length, CRCs) by TensorBoard's own writer."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    values = [summary_pb2.Summary.Value(tag=name, simple_value=float(scalars[name])) for name in sorted(scalars)]
    buffer = io.BytesIO()
    records = RecordWriter(buffer)
    records.write(event_pb2.Event(wall_time=wall_time, file_version=FILE_VERSION).SerializeToString())
    summary = summary_pb2.Summary(value=values)
    records.write(event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString())
    return buffer.getvalue()


def write_scalars(folder: Path, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> Path:
    """Write ``scalars`` (tag -> value) at ``step`` as one event file in ``folder`` (created if missing), atomically:
    temporary name without ``tfevents`` (TensorBoard ignores it), fsync, rename. Returns the file's path."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int (the iteration), not {step!r}")
    bad = [name for name in scalars if not isinstance(name, str) or not name]
    if bad:
        raise ValueError(f"scalar names must be non-empty strings, not {bad!r}")
    wall = time.time() if wall_time is None else wall_time
    if not math.isfinite(wall):
        raise ValueError(f"wall_time must be a finite number of seconds, not {wall!r}")
    data = event_file_bytes(step, scalars, wall)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / event_file_name(step)
    tmp = folder / f".partial-{step:010d}-{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(folder)
    return path


def record_iteration(lake: DataLake, run_id: str, iteration: int, metrics: Mapping[str, float]) -> Path | None:
    """Write a committed iteration's metrics to the run's TensorBoard folder, never failing: an OS error (disk full,
    permissions) is logged as a warning and ``None`` returned; :func:`rebuild_tensorboard` can regenerate the files
    from the lake later. (A run writes them through its ``tensorboard`` tracker: :mod:`ragen_core.monitor.trackers`.)
    """
    try:
        return write_scalars(lake.tensorboard_dir(run_id), iteration, metrics)
    except OSError as exc:
        LOGGER.warning(
            "run %s iteration %d: TensorBoard events not written (%s); the lake has them", run_id, iteration, exc
        )
        return None


def rebuild_tensorboard(lake: DataLake, run_id: str) -> list[Path]:
    """(Re)write the TensorBoard files of every committed iteration of ``run_id`` from its ``metrics`` rows, e.g.
    for a run trained without the ``tensorboard`` tracker (``monitor.trackers``). Returns the files written, in
    iteration order."""
    committed = set(lake.committed_iterations(run_id))
    if not committed:
        raise LakeError(f"run {run_id!r} has no committed iterations in {lake.root}; list the runs with `ragen runs`")
    rows = lake.read_table("metrics", run_id, columns=["iteration", "name", "value"]).to_pylist()
    by_iteration: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["iteration"] in committed:
            by_iteration.setdefault(row["iteration"], {})[row["name"]] = row["value"]
    folder = lake.tensorboard_dir(run_id)
    return [
        write_scalars(folder, i, by_iteration[i], lake.commit_marker(run_id, i).stat().st_mtime)  # commit time
        for i in sorted(by_iteration)
    ]
