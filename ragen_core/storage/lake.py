"""The trajectory lake on disk: all Parquet reading and writing, and the commit protocol.

Where everything lies under the data root is :mod:`ragen_core.storage.layout`'s (it spells every name); the lake
hands those paths out, each folder a writer fills checked to be a real folder (no link out of the data root). The
run layer asks it for a stage's folder, a checkpoint's folder, which stages of an interrupted iteration finished,
and to discard the rest. Stage names are the constants of :class:`Stage`. File names are deterministic (run,
iteration, stage, part), so a redone stage overwrites instead of adding rows. Every file is written under a
temporary name and renamed into place, so readers never see a partial file. Reading is the read path's
(:mod:`ragen_core.storage.reader`: the visible files listed and checked, then read, older ``schema_version`` files
brought to the current schema). What works on whole runs from outside the commit protocol (compaction, removal, the
layout upgrade, the export, disk space) is the maintenance wing's (:mod:`ragen_core.storage.maintenance`), which
takes a lake.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ragen_core.storage import layout
from ragen_core.storage.files import (
    TRASH_PREFIX,
    LakeError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    discard,
    read_json,
    read_parquet,
)
from ragen_core.storage.layout import (
    ITERATION_FOLDER,
    published_by_stage,
    published_name_of,
    staged_part_name,
)
from ragen_core.storage.locks import check_writing
from ragen_core.storage.names import is_valid_run_id, validate_run_id
from ragen_core.storage.parts import check_not_superseded, record_parts
from ragen_core.storage.reader import read_rows, visible_files
from ragen_core.storage.relocation import located_form, stored_form
from ragen_core.storage.rows import Rows, check_partition, rows_table
from ragen_core.storage.runs import manifest_row, runs_table
from ragen_core.storage.storecopy import store_copy
from ragen_core.storage.trust import (
    check_manifest,
    check_real_folder,
    check_real_folders,
    check_regular_file,
    iteration_folders,
    part_files,
)
from ragen_core.storage.versioning import check_publishable
from schemas.manifest import RunManifest
from schemas.tables import TABLES, TableSpec
from schemas.versions import UPGRADES, UpgradeRegistry

__all__ = ["DataLake", "LakeError", "Stage", "atomic_write_json", "atomic_write_parquet", "read_parquet"]


class Stage:
    """The lake's names of the batches that stages stage and publish (staging folders, done markers, quarantine
    folders, part-file tokens). A batch is named for what it holds; the stage that writes it has its own name
    (its row in :data:`ragen_core.run.stages.ITERATION`): the ``rollout`` batch is published by ``filter``."""

    ROLLOUT = "rollout"  # a training iteration's rollouts (validated, filtered, then published)
    COMMIT = "commit"  # the small tables an iteration's commit writes (metrics, events, evaluations, checkpoints)
    DEMOS = "demos"  # the bootstrap's scripted demonstrations
    SKIP = "skip"  # the event of an iteration skipped on resume

    @staticmethod
    def evaluation(env_name: str) -> str:
        """The validation rollouts of one env (``eval-<env>``)."""
        return f"eval-{env_name}"


class DataLake:
    """Paths and atomic I/O of one data root. ``tables`` and ``upgrades`` default to the project's own."""

    def __init__(
        self,
        root: str | Path,
        tables: Mapping[str, TableSpec] | None = None,
        upgrades: UpgradeRegistry | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.tables: Mapping[str, TableSpec] = TABLES if tables is None else tables
        self.upgrades = UPGRADES if upgrades is None else upgrades

    def spec(self, table: str) -> TableSpec:
        if table not in self.tables:
            raise LakeError(f"unknown table {table!r}; tables: {', '.join(self.tables)}")
        return self.tables[table]

    def _parquet_spec(self, table: str) -> TableSpec:
        spec = self.spec(table)
        if spec.source != "parquet":
            raise LakeError(f"table {table!r} is derived from the run manifests; write the manifest instead")
        return spec

    # -- paths (:mod:`ragen_core.storage.layout`'s; every run id passes the run-id validator there) ---------------
    def table_dir(self, table: str) -> Path:
        return layout.table_dir(self.root, table)

    def run_partition_dir(self, table: str, run_id: str) -> Path:
        """The folder of a run's rows in ``table`` (one folder per iteration in it)."""
        return layout.partition_dir(self.table_dir(table), run_id)

    def partition_dir(self, table: str, run_id: str, iteration: int) -> Path:
        return layout.partition_dir(self.table_dir(table), run_id, iteration)

    # the folders a run's writers fill and clear are checked to be real folders (no link out of the data root) each
    # time their path is built: a planted link would take the writes, or a redo's deletions, elsewhere
    def stage_dir(self, run_id: str, iteration: int, stage: str) -> Path:
        return self._real(layout.stage_dir(self.root, run_id, iteration, stage), "staging folder")

    def _staging(self, run_id: str, iteration: int | None = None) -> Path:
        return self._real(layout.staging_dir(self.root, run_id, iteration), "staging folder")

    def _real(self, path: Path, what: str) -> Path:
        return check_real_folders(self.root, path, what)

    def quarantine_dir(self, run_id: str, iteration: int, stage: str) -> Path:
        return self._real(layout.quarantine_dir(self.root, run_id, iteration, stage), "quarantine folder")

    def commit_marker(self, run_id: str, iteration: int) -> Path:
        folder = self._real(layout.commits_dir(self.root, run_id), "commits folder")
        return folder / layout.commit_marker_name(iteration)

    def run_dir(self, run_id: str) -> Path:
        return self._real(layout.run_dir(self.root, run_id), "run folder")

    def models_dir(self) -> Path:
        return layout.models_dir(self.root)

    def bootstrap_model_dir(self, key: str) -> Path:
        """The folder of the model a bootstrap with settings ``key`` builds (its run id names it too)."""
        return layout.model_dir(self.root, layout.bootstrap_name(key))

    def sweep_file(self, sweep_id: str) -> Path:
        """The stored plan of a sweep (``sweep_id``: checked by the sweep module, a name like a run id)."""
        return layout.sweep_file(self.root, sweep_id)

    def prefect_home(self, name: str) -> Path:
        """A folder for the Prefect home (and its local server's database) of one command attempt named ``name``."""
        return layout.prefect_home(self.root, name)

    def update_group_dir(self, run_id: str) -> Path:
        """A launched update group's logs, control files and the policy export it hands to the rollout side."""
        return self._run_subdir(run_id, layout.UPDATE_GROUP, "update group folder")

    def _run_subdir(self, run_id: str, name: str, what: str) -> Path:
        return self._real(layout.run_subdir(self.root, run_id, name), what)

    def policy_export_dir(self, run_id: str) -> Path:
        """The Hugging Face export through which the training side hands new weights to the rollout side."""
        return layout.policy_export_dir(self.update_group_dir(run_id))

    def vllm_server_dir(self, run_id: str) -> Path:
        """The run's vLLM rollout server: its log (``rollout.backend=vllm``)."""
        return self._run_subdir(run_id, layout.VLLM_SERVER, "vLLM server folder")

    def sampler_dir(self, run_id: str) -> Path:
        """The sampler process of an async run (``trainer.max_staleness`` >= 1, ``rollout.backend=hf``): its log."""
        return self._run_subdir(run_id, layout.SAMPLER, "sampler folder")

    def tensorboard_dir(self, run_id: str) -> Path:
        """The run's TensorBoard folder (``tensorboard --logdir`` it, or the ``runs`` folder for several runs)."""
        self.run_dir(run_id)
        return layout.run_subdir(self.root, run_id, layout.TENSORBOARD)

    def trackers_dir(self, run_id: str) -> Path:
        """The run's experiment-tracker folder (``monitor.trackers``: MLflow's local store, W&B's offline runs)."""
        return self._run_subdir(run_id, layout.TRACKERS, "trackers folder")

    # -- checkpoint folders (their contents are ragen_core.training.checkpoint's) ----------------------------------
    def checkpoints_dir(self, run_id: str) -> Path:
        """The folder holding every checkpoint of the run (inside the run's folder: removing the run removes them)."""
        return self._run_subdir(run_id, layout.CHECKPOINTS, "checkpoint folder")

    def checkpoint_dir(self, run_id: str, updates: int) -> Path:
        """The folder of the checkpoint taken after ``updates`` updates."""
        if int(updates) < 0:
            raise ValueError(f"a checkpoint holds a number of updates >= 0, got {updates}")
        return self.checkpoints_dir(run_id) / layout.checkpoint_folder_name(updates)

    def list_checkpoints(self, run_id: str) -> list[tuple[int, Path]]:
        """``(updates, folder)`` of the run's complete checkpoints (with their info file), oldest first."""
        folder = self.checkpoints_dir(run_id)
        found = []
        for path in folder.iterdir() if folder.is_dir() else []:
            match = layout.CHECKPOINT_NAME.match(path.name)
            if match:
                check_real_folder(path, "checkpoint folder")  # never loaded from, nor pruned through, a link
            if match and path.is_dir() and layout.checkpoint_file(path, layout.CHECKPOINT_INFO).is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest_checkpoint(self, run_id: str, at_most: int | None = None) -> tuple[int, Path] | None:
        """The newest complete checkpoint (of at most ``at_most`` updates when given), or None."""
        candidates = [(n, p) for n, p in self.list_checkpoints(run_id) if at_most is None or n <= at_most]
        return candidates[-1] if candidates else None

    def prune_checkpoints(self, run_id: str, keep_last: int) -> list[Path]:
        """Delete all but the newest ``keep_last`` complete checkpoints; return the deleted folders, oldest first."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (the newest checkpoint is what a resume needs), got {keep_last}")
        removed = [path for _, path in self.list_checkpoints(run_id)[:-keep_last]]
        for path in removed:
            discard(path)
        return removed

    def checkpoint_origin(self, folder: str | Path) -> tuple[str | None, int | None]:
        """(run, updates) when ``folder`` is a checkpoint of this data root (or its ``hf/`` export), else
        (None, None)."""
        try:
            parts = Path(folder).resolve().relative_to(layout.run_dir(self.root)).parts
        except ValueError:
            return None, None
        if len(parts) < 3 or parts[1] != layout.CHECKPOINTS or not is_valid_run_id(parts[0]):
            return None, None
        match = layout.CHECKPOINT_NAME.match(parts[2])
        return (parts[0], int(match.group(1))) if match else (None, None)

    # -- staging -----------------------------------------------------------------------------------------------
    def stage_table(
        self,
        run_id: str,
        iteration: int,
        stage: str,
        table: str,
        data: pa.Table,
        part: int = 0,
        *,
        strict: bool = True,
    ) -> Path:
        """Write a stage's output table into staging under a deterministic name.

        ``strict=False`` stages a table that may not match its schema, for a validation step (which quarantines
        what fails) to judge; nothing staged is visible to readers until :meth:`publish`.
        """
        expected = self._parquet_spec(table).arrow_schema
        if strict and not data.schema.equals(expected, check_metadata=False):
            raise LakeError(f"table {table!r} does not match its schema:\n{data.schema}\nexpected:\n{expected}")
        path = self.stage_dir(run_id, iteration, stage) / table / staged_part_name(stage, part)
        atomic_write_parquet(path, data.replace_schema_metadata(expected.metadata) if strict else data)
        return path

    def read_staged(self, run_id: str, iteration: int, stage: str, table: str) -> pa.Table:
        """All staged parts of ``table`` for a stage, concatenated as stored."""
        folder = self.stage_dir(run_id, iteration, stage) / table
        files = sorted(folder.glob("part-*.parquet"))
        if not files:
            raise LakeError(f"stage {stage!r} of {run_id}/{iteration} has no staged {table!r} rows")
        parts = [read_parquet(f) for f in files]
        try:
            return pa.concat_tables(parts)
        except pa.ArrowInvalid as exc:
            raise LakeError(f"the staged parts in {str(folder)!r} have different schemas: {exc}") from exc

    def mark_stage_done(self, run_id: str, iteration: int, stage: str, payload: dict[str, Any] | None = None) -> None:
        """Record that a stage finished (after its publish) with its result payload: a resume reuses it."""
        check_writing(self.root, run_id)  # a writer whose lease was taken over writes nothing
        atomic_write_json(layout.done_marker(self.stage_dir(run_id, iteration, stage)), payload or {})

    def stage_result(self, run_id: str, iteration: int, stage: str) -> dict[str, Any] | None:
        """The payload of a finished stage, or None if the stage has not finished."""
        marker = layout.done_marker(self.stage_dir(run_id, iteration, stage))
        return read_json(marker) if marker.is_file() else None

    def finished_stages(self, run_id: str, iteration: int) -> list[str]:
        """The stages of an uncommitted ``iteration`` that finished (published, marked done), sorted."""
        folder = self._staging(run_id, iteration)
        stages = folder.iterdir() if folder.is_dir() else []
        return sorted(s.name for s in stages if not s.name.startswith(".") and layout.done_marker(s).is_file())

    def discard_uncommitted(
        self, run_id: str, from_iteration: int, keep: dict[int, list[str]] | None = None
    ) -> list[str]:
        """Clear iterations ``>= from_iteration`` (none may be committed) for a redo; return the reused stages of
        ``from_iteration``.

        The stages of ``from_iteration`` that finished keep their published files and are reused; every other
        staged or published file of those iterations is discarded (renamed to a hidden name first, so readers stop
        seeing it at once). ``keep`` (iteration -> stages) says instead which finished stages of which iterations
        stay (an async run's training batches sampled ahead; an early stop's none)."""
        check_writing(self.root, run_id)  # a writer whose lease was taken over writes nothing
        if any(i >= from_iteration for i in self.committed_iterations(run_id)):
            raise LakeError(f"refusing to discard committed iterations >= {from_iteration} of run {run_id!r}")
        if keep is None:
            keep = {from_iteration: self.finished_stages(run_id, from_iteration)}
        kept = {i: sorted(set(stages) & set(self.finished_stages(run_id, i))) for i, stages in keep.items()}
        staging = self._staging(run_id)
        for folder in sorted(staging.iterdir()) if staging.is_dir() else []:
            if not (folder.name.isdigit() and int(folder.name) >= from_iteration):
                continue
            check_real_folder(folder, "staging folder")  # a link's target is never cleared
            for stage in sorted(p for p in folder.iterdir() if not p.name.startswith(TRASH_PREFIX)):
                stay = stage.name in kept.get(int(folder.name), [])
                if stay:
                    check_real_folder(stage, "staging folder")
                for item in sorted(stage.iterdir()) if stay else [stage]:
                    if item.name != layout.DONE_MARKER:
                        discard(item)
        for table in sorted(name for name, spec in self.tables.items() if spec.source == "parquet"):
            run_folder = self.run_partition_dir(table, run_id)
            for iteration, folder in list(iteration_folders(run_folder)):  # every part, compacted or not
                gone = []
                for file in part_files(folder) if iteration >= from_iteration else []:
                    if not published_by_stage(file.name, kept.get(iteration, [])):
                        discard(file)
                        gone.append(file.name)
                if gone:
                    record_parts(folder, {}, gone)  # after the files: a record may name more, never fewer
        return kept.get(from_iteration, [])

    def publish(self, run_id: str, iteration: int, stage: str, tables: Sequence[str] | None = None) -> list[Path]:
        """Move a stage's staged files (of ``tables``, default all) into the table partitions, one atomic rename
        per file; return the published paths."""
        check_writing(self.root, run_id)  # a writer whose lease was taken over writes nothing
        source = self.stage_dir(run_id, iteration, stage)
        folders = sorted(p for p in source.iterdir() if p.is_dir()) if source.is_dir() else []
        self.check_layout(run_id)
        published = []
        for table_dir in folders:
            if tables is not None and table_dir.name not in tables:
                continue
            target_dir = self.partition_dir(table_dir.name, run_id, iteration)
            target_dir.mkdir(parents=True, exist_ok=True)
            for folder in (target_dir.parent.parent, target_dir.parent, target_dir):  # never publish through a link
                check_real_folder(folder, "partition folder")
            files = {published_name_of(stage, f.name): f for f in sorted(table_dir.glob("part-*.parquet"))}
            for name in files:
                check_not_superseded(target_dir, name)
            # recorded before they appear: every listing that holds one of them finds it in the record after
            if files:
                record_parts(target_dir, {name: file.stat().st_size for name, file in files.items()})
            for name, file in files.items():
                os.replace(file, target_dir / name)
                published.append(target_dir / name)
        return published

    def check_layout(self, run_id: str) -> None:
        """Before publishing ``run_id``'s rows: :func:`ragen_core.storage.versioning.check_publishable`."""
        tables = [self.table_dir(n) for n, spec in self.tables.items() if spec.source == "parquet"]
        check_publishable(self.root, tables, validate_run_id(run_id))

    def quarantine(self, run_id: str, iteration: int, stage: str, report_json: str) -> Path:
        """Move a failed stage's staged output under ``quarantine/`` with its report; return the folder."""
        target = self.quarantine_dir(run_id, iteration, stage)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = self.stage_dir(run_id, iteration, stage)
        if source.is_dir():
            os.replace(source, target)
        atomic_write_bytes(layout.quarantine_report(target), report_json.encode())
        return target

    # -- writing rows of the small tables ----------------------------------------------------------------------
    def write_rows(
        self, table: str, run_id: str, iteration: int, rows: Rows, *, stage: str, part: int = 0, publish: bool = True
    ) -> Path:
        """Validate ``rows`` (pandera contract of ``table``; all rows in partition ``run_id``/``iteration``), stage
        them as ``part-<stage>-<part>.parquet`` and, unless ``publish=False``, publish that table of the stage
        (as ``part-<stage token>-<part>.parquet``).

        Rows that fail are quarantined with a report and a :class:`LakeError` names the failed checks. Returns
        the published (or staged) path. Writing the same (table, run, iteration, stage, part) again replaces it.
        """
        from schemas.contracts import validate_rows

        spec = self._parquet_spec(table)
        data = rows_table(spec, rows)
        report = validate_rows(spec, data)
        check_partition(data, run_id, iteration, table, report)
        if not report.ok:
            self.stage_table(run_id, iteration, stage, table, data, part, strict=False)
            context = {"table": table, "run_id": run_id, "iteration": iteration, "stage": stage}
            where = self.quarantine(run_id, iteration, stage, report.to_json(**context))
            raise LakeError(
                f"{table} rows for {run_id}/{iteration} failed checks {', '.join(report.failed_checks())}; "
                f"quarantined in {where} (see report.json); nothing was published"
            )
        conformed = data.select(spec.column_names).cast(spec.arrow_schema)
        path = self.stage_table(run_id, iteration, stage, table, conformed, part)
        if not publish:
            return path
        self.publish(run_id, iteration, stage, [table])
        return self.partition_dir(table, run_id, iteration) / published_name_of(stage, path.name)

    # -- reading published rows --------------------------------------------------------------------------------
    def partition_files(self, table: str, run_id: str | None = None, iteration: int | None = None) -> list[Path]:
        """The published part files readers see (sorted), listed and checked by the read path
        (:func:`ragen_core.storage.reader.visible_files`)."""
        return visible_files(self.root, self.spec(table), run_id, iteration)

    def read_table(
        self, table: str, run_id: str | None = None, iteration: int | None = None, columns: list[str] | None = None
    ) -> pa.Table:
        """Published rows of ``table`` (optionally one run / one iteration) in the table's current schema, in one
        pass (:mod:`ragen_core.storage.reader`): the visible files listed and checked, then read.

        Older files are upgraded; a damaged or too-new file raises :class:`LakeError` naming it.
        """
        spec = self.spec(table)
        if spec.source == "manifest":
            if iteration is not None:
                raise LakeError(f"table {table!r} has no iterations")
            result = self.read_runs(run_id)
        else:
            result = read_rows(self, spec, self.partition_files(table, run_id, iteration))
        return result.select(columns) if columns is not None else result

    def read_runs(self, run_id: str | None = None) -> pa.Table:
        """The ``runs`` table: one row per manifest under ``runs/`` (see :mod:`ragen_core.storage.runs`)."""
        if run_id is None:
            paths = sorted(layout.run_dir(self.root).glob(f"*/{layout.MANIFEST}"))
        else:  # exactly that run's manifest, never a pattern
            paths = [p for p in [layout.manifest_file(self.run_dir(run_id))] if p.is_file()]
        rows = []
        for path in paths:
            manifest = check_manifest(path, read_json(path))
            try:
                rows.append(manifest_row(manifest, self.committed_iterations(manifest.run_id)))
            except (KeyError, TypeError, ValueError) as exc:
                raise LakeError(f"manifest {str(path)!r} cannot be read as a runs row: {exc!r}") from exc
        return runs_table(rows)

    # -- commits and manifest ----------------------------------------------------------------------------------
    def commit_iteration(self, run_id: str, iteration: int, payload: dict[str, Any]) -> None:
        """Mark the iteration committed, then drop its staging folder. A writer whose lease on the run was taken
        over (:func:`ragen_core.storage.locks.check_writing`) is refused first."""
        check_writing(self.root, run_id)
        marker = self.commit_marker(run_id, iteration)
        copy = store_copy(self.root)
        if copy is not None:  # a data root in an object store: the bucket's commit decides, then writes the marker
            copy.commit(run_id, iteration, payload)
        else:
            atomic_write_json(marker, payload)
        shutil.rmtree(self._staging(run_id, iteration), ignore_errors=True)

    def withdraw_commit(self, run_id: str, iteration: int) -> None:
        """Withdraw a committed iteration's marker (a run extended past its final validation reopens it); in an
        object store, its commit object first (deleted only while it is the one this copy holds)."""
        check_writing(self.root, run_id)
        copy = store_copy(self.root)
        if copy is not None:
            copy.withdraw(run_id, iteration)
        self.commit_marker(run_id, iteration).unlink()

    def commit_payload(self, run_id: str, iteration: int) -> dict[str, Any]:
        """The payload of a committed iteration's marker (e.g. ``skipped``); a :class:`LakeError` if uncommitted."""
        marker = self.commit_marker(run_id, iteration)
        if not marker.is_file():
            raise LakeError(f"iteration {iteration} of run {run_id!r} is not committed")
        return read_json(marker)

    def committed_iterations(self, run_id: str) -> list[int]:
        """The run's committed iterations (its commit markers ``_commits/<id>/iteration=<n>.json``), sorted."""
        folder = layout.commits_dir(self.root, run_id)
        found = []
        for path in folder.glob(f"{layout.KEYED_ITERATION}*.json") if folder.is_dir() else []:
            match = ITERATION_FOLDER.fullmatch(path.stem)
            if match is None:
                raise LakeError(
                    f"commit marker {str(path)!r} is not iteration=<n>.json; it was changed by hand or "
                    "planted: move it out of the data root, then try again"
                )
            found.append(int(match.group(1)))
        return sorted(found)

    def write_manifest(self, run_id: str, manifest: RunManifest) -> None:
        """Write the run's manifest (atomically), with the JSON keys of its fields (:meth:`RunManifest.stored`); the
        folders it names inside the data root relative to it (:mod:`ragen_core.storage.relocation`)."""
        check_writing(self.root, run_id)  # a writer whose lease was taken over writes nothing
        atomic_write_json(layout.manifest_file(self.run_dir(run_id)), stored_form(manifest.stored(), self.root))
        copy = store_copy(self.root)
        if copy is not None:
            copy.push_loose(run_id)

    def publish_rewrite(self, run_id: str, every_iteration: bool = False) -> None:
        """A rewrite of the run's committed files (a compaction; ``every_iteration``: its files of every iteration,
        a layout upgrade) made visible: in an object store, uploaded as one changeset and committed
        (:meth:`~ragen_core.storage.storecopy.StoreCopy.rewrite`); nothing on a local root, where each step was its
        own atomic rename. The caller holds the run's writer lock."""
        check_writing(self.root, run_id)
        copy = store_copy(self.root)
        if copy is not None:
            copy.rewrite(run_id, every_iteration)

    def read_manifest(self, run_id: str) -> RunManifest | None:
        """The run's manifest, or None when it has none; one that is not a manifest naming this run (a field of the
        wrong type, a newer version) or is a link raises a :class:`LakeError` naming the file
        (:func:`ragen_core.storage.trust.check_manifest`). The folders it names are paths under this root when they
        lie inside it, wherever the root was when they were written (:func:`located_form`)."""
        path = layout.manifest_file(self.run_dir(run_id))
        if not check_regular_file(path, "manifest"):  # a link, folder or FIFO in its place raises
            return None
        return check_manifest(path, located_form(read_json(path), self.root))
