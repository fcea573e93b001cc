"""Housekeeping of whole runs: the overview behind ``ragen runs`` and the removal behind ``ragen runs rm``.

What a run owns under the data root (and what removal deletes):

- its rows in every Parquet table: ``<table>/run-<id>/`` (trajectories, turns, metrics, evaluations,
  checkpoints, events);
- ``_staging/<id>/``, ``_commits/<id>/``, ``quarantine/run_id=<id>/``, ``_prefect/<id>/`` (the CLI's Prefect home),
  ``_locks/<id>.lock``;
- ``runs/<id>/`` (the manifest and anything else kept with the run);
- the checkpoint folders its ``checkpoints`` rows name, when they lie under the data root;
- for a bootstrap run, the model it built (``models/bootstrap-<key>``; runs that started from it are listed as a
  warning: the model is rebuilt when needed).

Removal order, so a crash leaves a run that ``ragen runs rm`` can finish: the manifest is marked ``deleting``; each
table's partition folder is renamed to a hidden ``.deleting-run-<id>`` name (one atomic rename: readers see the
run's rows of that table or none) and then deleted; then the other folders; the manifest goes last. In a data root
in an object store, the run's objects in the bucket go after its local files, its commit objects first (readers
then stop counting its rows), its manifest last.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ragen_core.storage import layout
from ragen_core.storage.catalog import query
from ragen_core.storage.files import LakeError, read_parquet
from ragen_core.storage.lake import DataLake
from ragen_core.storage.locks import run_lock, run_writer, writer_gone
from ragen_core.storage.names import is_valid_run_id, validate_run_id
from ragen_core.storage.reader import StrayPartError
from ragen_core.storage.storecopy import store_copy
from ragen_core.storage.trust import check_real_folder, checkpoint_folder
from schemas.manifest import RunManifest

RUNS_OVERVIEW_SQL = """
WITH val AS (
    SELECT run_id, iteration, env, success_rate FROM evaluations
    UNION ALL
    SELECT run_id, iteration, split_part(name, '/', 2) AS env, value FROM metrics
    WHERE name LIKE 'val/%/success' AND (run_id, iteration) NOT IN (SELECT run_id, iteration FROM evaluations)
), last_val AS (
    SELECT run_id, max(iteration) AS iteration,
           arg_max(env_success, iteration) AS success
    FROM (SELECT run_id, iteration, string_agg(env || ' ' || printf('%.3f', success_rate), ', ' ORDER BY env)
                 AS env_success
          FROM val GROUP BY run_id, iteration)
    GROUP BY run_id
), cost AS (
    SELECT run_id, round(avg(value), 4) AS mfu FROM metrics WHERE name = 'perf/mfu' GROUP BY run_id
)
SELECT r.run_id, r.kind, r.status, left(r.config_hash, 8) AS config_hash, r.iterations_done AS iterations,
       v.iteration AS val_iteration, v.success AS val_success, c.mfu,
       strftime(r.created_at, '%Y-%m-%d %H:%M:%S') AS created_at
FROM runs r LEFT JOIN last_val v USING (run_id) LEFT JOIN cost c USING (run_id)
ORDER BY r.created_at, r.run_id
"""


class RunNotFoundError(LakeError):
    """No manifest and no data of the run in this data root."""


class RunActiveError(LakeError):
    """The run's manifest says it is still running."""


def runs_overview(lake: DataLake) -> pa.Table:
    """One row per run (manifest): kind, status, config hash, committed iterations, the validation success of the
    last validated iteration (from ``evaluations``, else the ``val/<env>/success`` metrics), the mean model FLOPs
    utilisation of its updates (``perf/mfu``; null for a run without updates), created_at. A manifest
    that cannot be read is a row with status ``broken`` (the other runs stay listed); one that says ``running``
    while no process holds the run's writer lock is a run whose writer died: ``interrupted`` (:func:`writer_gone`).
    Only the tables it reads get a view: a big lake's trajectories and turns are not listed for it."""
    overview = query(lake, RUNS_OVERVIEW_SQL, broken_manifests="row", tables=("runs", "metrics", "evaluations"))
    runs, statuses = overview.column("run_id").to_pylist(), overview.column("status").to_pylist()
    shown = [
        "interrupted" if status == "running" and writer_gone(lake.root, run) else status
        for run, status in zip(runs, statuses, strict=True)
    ]
    if shown == statuses:
        return overview
    column = overview.schema.get_field_index("status")
    return overview.set_column(column, "status", pa.array(shown, overview.schema.field("status").type))


def runs_with_data(lake: DataLake) -> set[str]:
    """Run ids that own anything under the data root: a manifest, table rows, commits, staging or quarantine. Only
    folders named by a valid run id count (a folder of another name is no run's). A Prefect home alone makes no run:
    commands that are not runs keep theirs there too (``eval``, a sweep's, ``reproduce-<finding>``); a run's own
    is removed with the run."""
    found = {p.parent.name for p in layout.run_dir(lake.root).glob(f"*/{layout.MANIFEST}")}
    for spec in lake.tables.values():
        folders = lake.table_dir(spec.name).glob(f"{layout.RUN_FOLDER_PREFIX}*")
        found |= {p.name.removeprefix(layout.RUN_FOLDER_PREFIX) for p in folders}
    for folder in (layout.commits_dir(lake.root), layout.staging_dir(lake.root)):
        found |= {p.name for p in folder.glob("*") if p.is_dir()}
    found |= {layout.quarantined_run(p.name) for p in layout.quarantine_dir(lake.root).glob("*")}
    return {run_id for run_id in found if is_valid_run_id(run_id)}


@dataclass
class RemovalPlan:
    """What removing one run deletes: rows per table, folders, and warnings to show before asking."""

    run_id: str
    status: str | None
    rows: dict[str, int | None] = field(default_factory=dict)
    table_dirs: list[Path] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def describe(self, root: Path) -> list[str]:
        lines = [f"{table}: {'?' if n is None else n} row(s)" for table, n in self.rows.items() if n != 0]
        lines += [f"{p.relative_to(root)}/" if p.is_dir() else str(p.relative_to(root)) for p in self.paths]
        return lines


def _owned_models(lake: DataLake, run_id: str, manifest: RunManifest | None) -> tuple[list[Path], list[str]]:
    """The model a bootstrap run built, and warnings naming the runs that started from it."""
    if manifest is None or manifest.kind != "bootstrap" or not manifest.model_dir:
        return [], []
    model = Path(manifest.model_dir)
    # only the model folder the bootstrap run itself builds: models/<its run id>, no link on the way
    if model != layout.model_dir(lake.root, run_id) or model.is_symlink() or lake.models_dir().is_symlink():
        return [], [f"model {str(model)!r} of its manifest is not models/{run_id}: not removed"]
    users = []
    for path in sorted(layout.run_dir(lake.root).glob(f"*/{layout.MANIFEST}")):
        other = path.parent.name
        started_from = lake.read_manifest(other)
        if other != run_id and started_from is not None and started_from.model_dir == manifest.model_dir:
            users.append(other)
    warnings = [f"runs that started from its model {model.name}: {', '.join(users)}"] if users else []
    return [model], warnings


def _row_count(files: list[Path]) -> int | None:
    """Rows in ``files`` from their footers; None when one cannot be read (a damaged file is removed all the same)."""
    try:
        return sum(pq.read_metadata(f).num_rows for f in files)
    except (pa.ArrowException, OSError):
        return None


def _rows_of(lake: DataLake, table: str, run_id: str) -> int | None:
    """The run's rows in ``table``; None when its files cannot be counted (damaged, or a part file the lake did not
    publish there: removed all the same, with the whole partition). A link or a name against the layout still
    refuses the removal (it could lead the deletion out of the data root)."""
    try:
        return _row_count(lake.partition_files(table, run_id))
    except StrayPartError:
        return None


def _checkpoint_paths(lake: DataLake, run_id: str) -> tuple[list[Path], list[str]]:
    """Checkpoint folders under the data root that the run's ``checkpoints`` rows name (and warnings). Each path is
    held to the layout first (:func:`ragen_core.storage.layout.checkpoint_folder`): a row naming anything but one of
    the run's own checkpoint folders raises, naming its file, before anything is deleted."""
    stored = []
    for source in lake.partition_files("checkpoints", run_id):
        try:
            stored.append((source, read_parquet(source).column("path").to_pylist()))
        except (LakeError, KeyError) as exc:  # a damaged file must not keep its run from being removed
            return [], [f"checkpoint folders unknown, the checkpoints table cannot be read: {exc}"]
    folders = {checkpoint_folder(lake.root, run_id, path, source) for source, paths in stored for path in paths}
    return sorted(f for f in folders if f is not None and f.exists()), []


def _check_own_folders(lake: DataLake, run_id: str) -> None:
    """The run's folders that removal renames or deletes are real folders, not links (a link would take the
    deletion elsewhere, or stop it half-way): refused, naming the link, before anything changes."""
    for spec in lake.tables.values():
        check_real_folder(lake.table_dir(spec.name), "table folder")
        if spec.source == "parquet":
            check_real_folder(lake.run_partition_dir(spec.name, run_id), "partition folder")
    for folder in layout.top_folders(lake.root):
        check_real_folder(folder, "folder")
    for folder in (*_working_folders(lake.root, run_id), lake.run_dir(run_id)):
        check_real_folder(folder, "folder")


def _working_folders(root: Path, run_id: str) -> tuple[Path, ...]:
    """A run's staging, commits, quarantine and Prefect home folders."""
    return (
        layout.staging_dir(root, run_id),
        layout.commits_dir(root, run_id),
        layout.quarantine_dir(root, run_id),
        layout.prefect_home(root, run_id),
    )


def interrupted_run(lake: DataLake, run_id: str) -> bool:
    """Whether the run's manifest says ``running`` while no process holds its writer lock: its writer died (a
    SIGKILL, a worker or host lost) without updating its status. A writer on another host holds the run until its
    lease expires (:mod:`ragen_core.storage.lease`)."""
    manifest = lake.read_manifest(run_id)
    return manifest is not None and manifest.status == "running" and writer_gone(lake.root, run_id)


def plan_removal(lake: DataLake, run_id: str, force: bool = False) -> RemovalPlan:
    """What ``remove_run`` would delete; refuses an unknown run, and a running one unless ``force``."""
    validate_run_id(run_id)
    if run_id not in runs_with_data(lake):
        known = sorted(runs_with_data(lake))
        listed = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "") if known else "none"
        raise RunNotFoundError(f"unknown run {run_id!r} in {lake.root}; runs: {listed}")
    manifest = lake.read_manifest(run_id)
    status = manifest.status if manifest is not None else None
    if status == "running" and writer_gone(lake.root, run_id):
        status = "interrupted"  # its writer died without updating its status (:func:`interrupted_run`)
    if manifest is not None and status == "running" and not force:
        raise RunActiveError(
            f"run {run_id!r} is still 'running' according to its manifest (pid {manifest.pid} on "
            f"{manifest.host}); stop it first, or pass --force if it died without updating its status"
        )
    _check_own_folders(lake, run_id)
    plan = RemovalPlan(run_id, status)
    for spec in lake.tables.values():
        if spec.source != "parquet":
            continue
        folder = lake.run_partition_dir(spec.name, run_id)
        if folder.is_dir():
            plan.rows[spec.name] = _rows_of(lake, spec.name, run_id)
            plan.table_dirs.append(folder)
    models, model_warnings = _owned_models(lake, run_id, manifest)
    checkpoints, checkpoint_warnings = _checkpoint_paths(lake, run_id)
    plan.warnings = model_warnings + checkpoint_warnings
    candidates = [
        *_working_folders(lake.root, run_id),
        *checkpoints,
        *models,
        layout.housekeeping_lock_file(lake.root, run_id),
        lake.run_dir(run_id),
    ]
    plan.paths = [p for p in dict.fromkeys(candidates) if p.exists()]
    return plan


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_run(lake: DataLake, plan: RemovalPlan) -> None:
    """Delete everything in ``plan`` (order and crash behaviour: module docstring); the manifest goes last. A file
    system refusal (a read-only root, a folder that cannot be deleted) raises a :class:`LakeError` saying how far
    it got; when nothing was deleted yet, the manifest keeps its status (never left ``deleting``)."""
    run_id = plan.run_id
    manifest, progress = None, {"deleted": False}
    try:
        # the writer's own lock (RunLockedError naming the live writer, whatever --force said about the manifest),
        # then the housekeeping lock: nothing is deleted while a process writes the run
        with run_writer(lake.root, run_id, wait=False), run_lock(lake, run_id):
            manifest = lake.read_manifest(run_id)
            if manifest is not None:
                lake.write_manifest(run_id, manifest.updated(status="deleting"))
            _delete_owned(lake, plan, progress)
            copy = store_copy(lake.root)
            if copy is not None:  # a data root in a bucket: the run's objects there, its commits first
                owned = [p.relative_to(lake.root).as_posix() for p in plan.paths if p.is_relative_to(lake.root)]
                copy.remove_run(run_id, [p for p in owned if p.startswith(f"{layout.MODELS}/")])
        for path in (lake.run_dir(run_id), layout.housekeeping_lock_file(lake.root, run_id)):
            if path.exists():
                _delete(path)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        if not progress["deleted"] and manifest is not None:
            with contextlib.suppress(OSError):  # put the status back: nothing of the run was removed
                lake.write_manifest(run_id, manifest)
        done = "nothing was removed;"
        if progress["deleted"]:
            done = "removal stopped half-way; run `ragen runs rm` again once"
        raise LakeError(
            f"cannot remove run {run_id!r}: {exc.strerror or exc}{where}; {done} the data root can be written"
        ) from exc


def _delete_owned(lake: DataLake, plan: RemovalPlan, progress: dict[str, bool]) -> None:
    """Delete the run's table partitions and the other paths of ``plan`` (not its manifest folder, not its lock);
    ``progress["deleted"]`` turns true as the first thing goes (a table partition is renamed away first)."""
    run_id = plan.run_id
    for spec in [s for s in lake.tables.values() if s.source == "parquet"]:
        folder = lake.run_partition_dir(spec.name, run_id)
        trash = layout.deleting(folder)
        if folder.is_dir():
            if trash.exists():  # left by a removal that crashed
                shutil.rmtree(trash)
            os.replace(folder, trash)
            progress["deleted"] = True
        if trash.exists():
            shutil.rmtree(trash)
    lock = layout.housekeeping_lock_file(lake.root, run_id)
    for path in plan.paths:
        if path not in (lake.run_dir(run_id), lock) and path.exists():
            progress["deleted"] = True
            _delete(path)
