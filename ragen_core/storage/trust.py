"""The lake trusts no name it reads: every name or path taken from the data root is checked against the layout
before it is used to read or delete anything.

The lake's own files name other files: a folder listing names partitions and part files, a compaction marker names
the files it replaces, a manifest names its run, a ``checkpoints`` row names a checkpoint folder. Any of them can be
damaged, planted or edited by hand, so each is held to the layout it must follow; a violation raises a
:class:`~ragen_core.storage.files.LakeError` naming the offending file, and the caller reads and deletes nothing on
its account. The rules:

- **Folders and part files** (layout version 2; :mod:`ragen_core.storage.layout` spells every name). Under a
  table folder only ``run-<run id>`` (a valid run id, :mod:`ragen_core.storage.names`) holding ``iteration-<n>`` (a
  plain decimal, no sign, no leading zero) holding ``part-<name>.parquet`` files (letters, digits, ``.``, ``_``,
  ``-``). Hidden entries (a leading ``.``: temporary files, folders being deleted, the compaction marker) and
  entries of another form (notes) are not parts and are never read. No table folder, partition folder or part file
  may be a symbolic link: a link could make readers count rows from outside the data root, and housekeeping write
  or delete there. The names are chosen for the other tools that read the folders (docs/lake.md, "Reading the lake
  with other tools"): no ``key=value`` folder, so pandas, pyarrow and polars infer no partition column that clashes
  with the files' own ``run_id`` and ``iteration`` columns; no split word of Hugging Face ``datasets``
  (train, test, eval, val, dev, ...) in a part name (a published part is ``part-<digest of its stage>-<k>``), so
  ``load_dataset`` takes no file for a split; only ``.parquet`` files, the marker hidden. Layout 1 (``run_id=<id>/
  iteration=<n>/part-<stage>-<k>.parquet``, ``_COMPACTION.json``) is refused, naming the upgrade
  (:mod:`ragen_core.storage.maintenance.upgrade`).
- **Only published parts** (:mod:`ragen_core.storage.parts`): a partition's record names the part files the lake
  published there, with their sizes; any other file (a copy, a second name, a replaced file) fails every read of its
  table, naming it.
- **Rows belong to their folder.** A part file under ``run_id=A/iteration=n/`` holds rows of run A and iteration n
  only, and every column the table declares NOT NULL (for the file's schema version) is present and has no nulls
  (:func:`check_footer`, :func:`check_rows`): a file that says otherwise fails every read of its table, naming it.
- **Compaction markers** (:mod:`ragen_core.storage.parts`): ``merged`` is ``part-compacted-<16 hex>.parquet``, the
  name derived from ``replaces``; ``replaces`` lists distinct plain part-file names of the same folder, never the
  merged file; ``rows`` is the merged file's row count. A marker hides files only when its merged file is there and
  holds that many rows, and the replaced files still present hold no more rows than it (all of them present: exactly
  as many). A forged marker therefore cannot hide rows: to hide them it needs a merged file holding at least as many
  rows, and a marker that breaks a rule fails every read of the table instead of hiding anything.
- **Files that vanish** between a listing and the reading of a footer were removed by a writer's atomic step (a
  compaction deleting what its merged file replaced, a redo discarding a stage): never damage. A replaced file then
  counts as absent (it hides nothing); any other raises :class:`~ragen_core.storage.files.VanishedFileError`, and
  the reader lists that partition again and checks it whole, so it sees the partition whole or not at all.
- **A run's working folders** (``runs/<id>/``, its ``checkpoints/``, ``_staging/<id>/`` and its iteration and stage
  folders, ``_commits/<id>/``, ``quarantine/``) and **lock files** (``runs/<id>/writer.lock``, ``_locks/<id>.lock``)
  are no links either (:func:`check_real_folders`): writers fill and clear them, and a lock's holder record truncates
  its file, so a link would take writes or deletions out of the data root. The writer lease
  (``runs/<id>/writer.lease``) is created by ``link`` of a new file and renewed through its holder's open
  descriptor, never written through its name.
- **JSON files** of the lake are regular files of at most 64 MB, parsed with a bounded nesting
  (:func:`ragen_core.storage.files.read_json`). Before compaction deletes the files a marker replaces, the merged
  file must hold their very rows, not just as many (:mod:`ragen_core.storage.maintenance.compaction`).
- **Manifests** (``runs/<id>/manifest.json``): a regular file in a folder named by a valid run id, a JSON object
  whose ``run_id`` is that folder's name, of the shape :class:`schemas.manifest.RunManifest` declares (each field
  of its type; a manifest of a newer ``manifest_version`` is refused, saying to upgrade).
- **Checkpoint rows**: a row of run R names ``runs/R/checkpoints/iteration=<n>``, its ``hf/`` export or its
  ``adapter/`` (LoRA). Under this data root, exactly that folder (no link on the way); elsewhere (a data root that
  was moved or copied), a path that ends so, and the lake never touches it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragen_core.storage.files import LakeError, VanishedFileError, parquet_errors, read_parquet
from ragen_core.storage.layout import (
    CHECKPOINT_ADAPTER,
    CHECKPOINT_HF,
    CHECKPOINTS,
    ITERATION_FOLDER,
    ITERATION_PREFIX,
    MERGED_NAME,
    OLD_RUN_FOLDER_PREFIX,
    PART_NAME,
    PARTITION_ITERATION,
    RUN_FOLDER_PREFIX,
    RUNS,
    iteration_folder_name,
    old_layout_error,
    run_dir,
    run_folder_name,
)
from ragen_core.storage.names import is_valid_run_id
from schemas.manifest import ManifestError, NewerManifestError, RunManifest
from schemas.tables import TableSpec
from schemas.versions import stored_version

_HOW_TO_FIX = "it was changed by hand or planted; move it out of the data root, then try again"


def _show(path: Path | str) -> str:
    return repr(str(path))


def _mode_unless_link(path: Path, what: str) -> int | None:
    """``path``'s mode without following it (None when absent); a :class:`LakeError` when it is a symbolic link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LakeError(f"cannot inspect {what} {_show(path)}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(mode):
        raise LakeError(
            f"{what} {_show(path)} is a symbolic link (to {os.readlink(path)!r}); the lake never follows links: "
            f"{_HOW_TO_FIX}"
        )
    return mode


def check_real_folder(path: Path, what: str) -> None:
    """``path`` is a folder and not a symbolic link (a link would lead readers or deletions out of the layout)."""
    mode = _mode_unless_link(path, what)
    if mode is not None and not stat.S_ISDIR(mode):
        raise LakeError(f"{what} {_show(path)} is not a folder; {_HOW_TO_FIX}")


def check_real_folders(root: Path, path: Path, what: str) -> Path:
    """``path`` (under the data root ``root``) with every folder from ``root`` down to it checked by
    :func:`check_real_folder` (absent ones are fine: they are created as real folders). A lake folder that a writer
    fills or clears (a run's staging, commits, quarantine, checkpoints) must not lead out of the data root."""
    for depth in range(1, len(path.relative_to(root).parts) + 1):
        check_real_folder(Path(root, *path.relative_to(root).parts[:depth]), what)
    return path


def check_regular_file(path: Path, what: str) -> bool:
    """Whether ``path`` exists; a :class:`LakeError` when it is a symbolic link or not a regular file."""
    mode = _mode_unless_link(path, what)
    if mode is None:
        return False
    if not stat.S_ISREG(mode):
        raise LakeError(f"{what} {_show(path)} is not a regular file; {_HOW_TO_FIX}")
    return True


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as listing:
            return sorted(listing, key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LakeError(f"cannot list {_show(folder)}: {exc.strerror or exc}") from exc


def _checked_folder(entry: os.DirEntry, what: str) -> bool:
    """Whether a listed entry is a folder to descend into (a link or a file in its place raises)."""
    if entry.is_symlink():
        check_real_folder(Path(entry.path), what)  # raises, naming the link and its target
    if not entry.is_dir(follow_symlinks=False):
        raise LakeError(f"{what} {_show(entry.path)} is not a folder; {_HOW_TO_FIX}")
    return True


def run_folders(table_dir: Path) -> Iterator[tuple[str, Path]]:
    """``(run id, folder)`` of every ``run-<id>`` partition of a table folder (hidden entries skipped); a folder of
    layout 1 (``run_id=<id>``) raises, naming the upgrade."""
    check_real_folder(table_dir, "table folder")
    for entry in _entries(table_dir):
        if entry.name.startswith(OLD_RUN_FOLDER_PREFIX):
            raise old_layout_error(table_dir.parent, Path(entry.path))
        if not entry.name.startswith(RUN_FOLDER_PREFIX):
            continue
        run_id = entry.name[len(RUN_FOLDER_PREFIX) :]
        if not is_valid_run_id(run_id):
            raise LakeError(f"partition folder {_show(entry.path)} does not name a valid run id; {_HOW_TO_FIX}")
        _checked_folder(entry, "partition folder")
        yield run_id, Path(entry.path)


def iteration_folders(run_folder: Path) -> Iterator[tuple[int, Path]]:
    """``(iteration, folder)`` of every ``iteration-<n>`` folder of a run's partition, in increasing order."""
    check_real_folder(run_folder, "partition folder")
    found = []
    for entry in _entries(run_folder):
        if not entry.name.startswith(ITERATION_PREFIX):
            continue
        match = PARTITION_ITERATION.fullmatch(entry.name)
        if match is None:
            raise LakeError(f"partition folder {_show(entry.path)} is not {ITERATION_PREFIX}<n>; {_HOW_TO_FIX}")
        _checked_folder(entry, "partition folder")
        found.append((int(match.group(1)), Path(entry.path)))
    yield from sorted(found)


def part_files(folder: Path) -> list[Path]:
    """The ``part-*.parquet`` files of one partition folder (sorted); a part name of another form, a link or
    anything but a regular file there raises."""
    files = []
    for entry in _entries(folder):
        if not (entry.name.startswith("part-") and entry.name.endswith(".parquet")):
            continue
        if PART_NAME.fullmatch(entry.name) is None:
            raise LakeError(f"part file {_show(entry.path)} has a name of no form the lake writes; {_HOW_TO_FIX}")
        if check_regular_file(Path(entry.path), "part file"):  # False: removed since the folder was listed
            files.append(Path(entry.path))
    return files


def partition_of(path: Path) -> tuple[str, int]:
    """``(run id, iteration)`` of the partition folder a part file sits in."""
    run_name, iteration_name = path.parent.parent.name, path.parent.name
    match = PARTITION_ITERATION.fullmatch(iteration_name)
    run_id = run_name[len(RUN_FOLDER_PREFIX) :] if run_name.startswith(RUN_FOLDER_PREFIX) else ""
    if match is None or not is_valid_run_id(run_id):
        raise LakeError(
            f"{_show(path)} does not lie in a <table>/{RUN_FOLDER_PREFIX}<id>/{ITERATION_PREFIX}<n>/ folder"
        )
    return run_id, int(match.group(1))


# -- rows belong to their folder -----------------------------------------------------------------------------------
def _required(spec: TableSpec, version: int) -> list[str]:
    """The NOT NULL columns a file of ``version`` must hold."""
    return [c.name for c in spec.columns_at(min(version, spec.version)) if not c.nullable]


def check_footer(path: Path, spec: TableSpec, metadata: pq.FileMetaData, renamed: bool = False) -> None:
    """From a part file's footer: its NOT NULL columns are present (and null-free where the statistics say), and
    its ``run_id`` / ``iteration`` columns hold only its folder's values (statistics; the columns themselves are
    read when a file has none). ``renamed``: an upgrade function changes this file's columns (their old names are
    not the table's), so the Python reader, which fails on a missing column, checks presence instead."""
    run_id, iteration = partition_of(path)
    schema = metadata.schema.to_arrow_schema()
    required = [] if renamed else _required(spec, stored_version(schema))
    missing = [name for name in required if name not in schema.names]
    if missing:
        raise LakeError(
            f"part file {_show(path)} lacks the NOT NULL column(s) {missing} of table {spec.name!r}; {_HOW_TO_FIX}"
        )
    columns = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    expected = {"run_id": run_id, "iteration": iteration}
    unproven = []
    for name in [*required, *(n for n in ("run_id", "iteration") if n not in required)]:
        if name not in columns:  # a nested column: its leaves are named otherwise; presence was checked above
            continue
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(columns[name]).statistics
            if stats is not None and stats.has_null_count and stats.null_count > 0:
                raise LakeError(f"part file {_show(path)} has nulls in the NOT NULL column {name!r}; {_HOW_TO_FIX}")
            if name not in expected:
                continue
            if stats is None or not stats.has_min_max:
                unproven.append(name)
            elif stats.min != expected[name] or stats.max != expected[name]:
                _wrong_partition(path, name, stats.min if stats.min != expected[name] else stats.max, expected)
    if unproven and metadata.num_rows:
        check_rows(path, read_parquet(path, sorted(set(unproven))), spec)


def check_rows(path: Path, table: pa.Table, spec: TableSpec) -> None:
    """The rows read from a part file belong to its folder's run and iteration, and the NOT NULL columns have no
    nulls (the Python reader's check, on the columns it read)."""
    _check_owned(path, table)
    nullable = {c.name: c.nullable for c in spec.columns}
    for name in table.column_names:
        if nullable.get(name) is False and table[name].null_count:
            raise LakeError(f"part file {_show(path)} has nulls in the NOT NULL column {name!r}; {_HOW_TO_FIX}")


def _check_owned(path: Path, table: pa.Table) -> None:
    """The ``run_id`` / ``iteration`` columns of ``table`` (read from ``path``) hold only its folder's values."""
    run_id, iteration = partition_of(path)
    for name, value in (("run_id", run_id), ("iteration", iteration)):
        if name not in table.column_names:
            continue
        column = table[name]
        wrong = pc.invert(pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False))
        if pc.any(wrong).as_py():
            index = pc.index(wrong, True).as_py()
            _wrong_partition(path, name, column[index].as_py(), {"run_id": run_id, "iteration": iteration})


def _wrong_partition(path: Path, column: str, found: Any, expected: Mapping[str, Any]) -> None:
    raise LakeError(
        f"part file {_show(path)} lies in partition {run_folder_name(expected['run_id'])}/"
        f"{iteration_folder_name(expected['iteration'])} "
        f"but holds rows with {column} = {found!r}; rows belong to the run and iteration of their folder: "
        f"{_HOW_TO_FIX}"
    )


def footer(path: Path) -> pq.FileMetaData:
    """A part file's footer; a damaged file raises naming it, a file removed since it was listed raises
    :class:`~ragen_core.storage.files.VanishedFileError` (the caller lists again)."""
    with parquet_errors(path):
        return pq.read_metadata(path)


# -- compaction markers --------------------------------------------------------------------------------------------
def check_marker(path: Path, payload: Any, merged_name_of: Any) -> dict[str, Any]:
    """A compaction marker's payload, held to the marker rules (module docstring; ``merged_name_of`` maps the
    replaced names to the merged file's name)."""

    def bad(problem: str) -> LakeError:
        return LakeError(f"compaction marker {_show(path)} {problem}; {_HOW_TO_FIX}")

    if not isinstance(payload, dict):
        raise bad("is not a JSON object")
    merged, replaces, rows = payload.get("merged"), payload.get("replaces"), payload.get("rows")
    if not isinstance(merged, str) or MERGED_NAME.fullmatch(merged) is None:
        raise bad(f"names {merged!r} as its merged file, not part-compacted-<16 hex digits>.parquet")
    if not isinstance(replaces, list) or not replaces:
        raise bad("has no list of replaced files")
    for name in replaces:
        if not isinstance(name, str) or PART_NAME.fullmatch(name) is None:
            raise bad(f"names {name!r} among the files it replaces, not a part file of its own folder")
    if len(set(replaces)) != len(replaces) or merged in replaces:
        raise bad("lists a file twice, or its merged file among the files it replaces")
    if merged != merged_name_of(replaces):
        raise bad(f"names {merged!r} as its merged file, not the name derived from the files it replaces")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise bad(f"gives {rows!r} as the merged file's row count")
    return payload


def check_replaced_rows(marker_path: Path, marker: Mapping[str, Any], present: Iterable[Path]) -> None:
    """The merged file holds the marker's row count, and the replaced files still present hold no more rows than it
    (exactly as many when all of them are present): else the marker would hide rows, and it raises instead.

    A replaced file listed in ``present`` that is gone by the time its footer is read was deleted by the
    compaction's last step (the merged file was already there: it is in the listing): it hides nothing, so it counts
    as absent, never as an error. A merged file that is gone raises
    :class:`~ragen_core.storage.files.VanishedFileError`: the listing is stale and the caller lists again."""
    folder = marker_path.parent
    merged_rows = footer(folder / marker["merged"]).num_rows
    present, replaced_rows = _rows_of_present(present)
    complete = len(present) == len(marker["replaces"])
    if merged_rows != marker["rows"] or replaced_rows > merged_rows or (complete and replaced_rows != merged_rows):
        raise LakeError(
            f"compaction marker {_show(marker_path)} would hide {replaced_rows} row(s) of {len(present)} file(s) "
            f"behind {marker['merged']!r}, which holds {merged_rows} (the marker says {marker['rows']}); "
            f"{_HOW_TO_FIX}"
        )


def _rows_of_present(listed: Iterable[Path]) -> tuple[list[Path], int]:
    """The files of ``listed`` still there when their footers are read, and their rows."""
    present, rows = [], 0
    for path in listed:
        try:
            rows += footer(path).num_rows
        except VanishedFileError:
            continue
        present.append(path)
    return present, rows


# -- manifests and checkpoint rows ----------------------------------------------------------------------------------
def check_manifest(path: Path, stored: Any) -> RunManifest:
    """A manifest read from ``runs/<id>/manifest.json``: a JSON object naming the run of its folder, of the
    :class:`~schemas.manifest.RunManifest` shape (brought to the current ``manifest_version``)."""
    folder = path.parent.name
    check_real_folder(path.parent, "run folder")  # a linked run folder would be a manifest from elsewhere
    if not is_valid_run_id(folder):
        raise LakeError(f"manifest {_show(path)} lies in a folder that is not a valid run id; {_HOW_TO_FIX}")
    try:
        manifest = RunManifest.from_stored(stored)
    except NewerManifestError as exc:
        raise LakeError(f"manifest {_show(path)} {exc}") from None
    except ManifestError as exc:
        raise LakeError(f"manifest {_show(path)} {exc}; {_HOW_TO_FIX}") from None
    if manifest.run_id != folder:
        raise LakeError(
            f"manifest {_show(path)} says run_id {manifest.run_id!r}, but it lies in the folder of run "
            f"{folder!r}; a manifest describes the run of its folder: {_HOW_TO_FIX}"
        )
    return manifest


def checkpoint_folder(root: Path, run_id: str, stored: Any, source: Path) -> Path | None:
    """The checkpoint folder a ``checkpoints`` row of ``run_id`` names (read from ``source``): under this data root
    exactly ``runs/<run_id>/checkpoints/iteration=<n>``; None for a path of another (moved) data root. Anything
    else raises."""

    def bad(problem: str) -> LakeError:
        return LakeError(
            f"checkpoints file {_show(source)} gives run {run_id!r} the checkpoint path {stored!r}, {problem}; a "
            f"run's checkpoints lie in runs/{run_id}/checkpoints/iteration=<n>/: {_HOW_TO_FIX}"
        )

    if not isinstance(stored, str) or not stored or "\x00" in stored:
        raise bad("not a path")
    path = Path(stored)
    parts = path.parts[:-1] if path.name in (CHECKPOINT_HF, CHECKPOINT_ADAPTER) else path.parts
    if not path.is_absolute() or ".." in path.parts or len(parts) < 5:
        raise bad("not an absolute path of a checkpoint folder")
    tail = parts[-4:]
    if tail[:3] != (RUNS, run_id, CHECKPOINTS) or ITERATION_FOLDER.fullmatch(tail[3]) is None:
        raise bad("not one of that run's checkpoint folders")
    folder = Path(*parts)
    if folder.parent.parent.parent.parent != root:
        return None  # written under another data root (this one was moved or copied): never touched from here
    for step in (run_dir(root), run_dir(root, run_id), folder.parent, folder):
        check_real_folder(step, "checkpoint folder")
    return folder
