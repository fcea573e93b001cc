"""Upgrading a data root's lake layout, in place (``ragen upgrade-lake``): the layout's counterpart of
:mod:`schemas.versions`, which brings old *files* to the current schema when they are read.

The layout version is recorded in ``<root>/_layout.json`` (:mod:`ragen_core.storage.versioning`); a
data root without it and with ``run_id=<id>`` folders in its tables is layout 1. Readers and writers refuse
layout-1 folders, naming this upgrade. Layout 1 to 2 (:mod:`ragen_core.storage.layout`, which spells both):

- ``<table>/run_id=<id>/iteration=<n>/`` becomes ``<table>/run-<id>/iteration-<n>/``;
- a part file ``part-<stage>-<k>.parquet`` becomes ``part-<stage token>-<k>.parquet`` (any other part name: the
  token of its whole stem, part 0); a merged file named by a compaction marker takes the name derived from the new
  names of the files it replaces, and the marker ``_COMPACTION.json`` becomes ``.compaction.json`` naming them;
- other regular files of a partition (notes) keep their name; hidden leftovers of an interrupted write are dropped;
- every new partition gets its record of published parts (:mod:`ragen_core.storage.parts`), written before the
  partition appears; so does every layout-2 partition without one (written before the records were kept), and
  ``_layout.json`` then says ``part_records``.

Every name is checked before the first change: an entry of a layout-1 run or partition folder that the upgrade
cannot carry over (a folder, hidden or not, a link, a device, a part file of no name the lake writes such as
``part-a b.parquet``, two files taking one new name), a partition of either layout where two files hold rows of the
same key (a copy, re-encoded or not: :mod:`ragen_core.storage.keys`) and a layout-2 partition without a record where
one file has two names raise a :class:`LakeError` naming it, with nothing changed (``ragen upgrade-lake``: one line,
exit 2).

The files themselves are not rewritten: each gets a second name (a hard link; a copy where the file system has
none). One partition at a time, under the run's housekeeping and writer locks:

1. fill a hidden ``.upgrading-iteration-<n>`` folder beside the new partition with the new names, fsync;
2. rename it to ``iteration-<n>``: **the partition's commit point** (one rename);
3. delete the old partition folder, then the run's old folder once empty.

A crash before 2 leaves the old partition whole and a hidden folder that the next upgrade deletes first; after 2,
the next upgrade finds the new partition, checks that it holds every old file under its new name (same size) and
finishes step 3. So the upgrade can be interrupted at any point and run again; no row is lost or doubled. Readers
refuse the data root until no layout-1 folder is left; ``_layout.json`` is written last.

A data root in a bucket (:mod:`ragen_core.storage.storecopy`) is upgraded in its local copy, which gets every object
first (a layout-1 file the copy no longer holds comes back until the bucket deletes it); each run's moved files are
then published as one rewrite under its lease (new names, records) before the bucket's layout-1 files of the run go,
and ``_layout.json`` is put last. Interrupted anywhere, the bucket holds each partition under its old name, its new
one or both (readers refuse it until the upgrade, run again, has finished).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ragen_core.storage.files import LakeError, atomic_write_json, fsync_dir, read_json
from ragen_core.storage.keys import check_files
from ragen_core.storage.lake import DataLake
from ragen_core.storage.layout import (
    ITERATION_FOLDER,
    LAYOUT_VERSION,
    OLD_COMPACTION_MARKER,
    OLD_RUN_FOLDER_PREFIX,
    PART_NAME,
    RUN_FOLDER_PREFIX,
    compaction_marker,
    iteration_folder_name,
    layout_file,
    parts_record_of,
    published_part_name,
    upgrading_partition,
)
from ragen_core.storage.locks import run_lock, run_writer
from ragen_core.storage.names import is_valid_run_id
from ragen_core.storage.parts import merged_name, record_parts
from ragen_core.storage.reader import read_record, trusted_parts
from ragen_core.storage.storecopy import store_copy
from ragen_core.storage.trust import (
    check_marker,
    check_real_folder,
    check_regular_file,
    iteration_folders,
    part_files,
)
from ragen_core.storage.versioning import layout_version, record_layout


@dataclass
class LayoutUpgrade:
    """What :func:`upgrade_layout` did: the partitions moved (table, run, iteration) and the layout now."""

    root: Path
    partitions: list[tuple[str, str, int]] = field(default_factory=list)
    files: int = 0
    layout: int = LAYOUT_VERSION
    recorded: int = 0  # layout-2 partitions whose record of published parts was written

    @property
    def runs(self) -> list[str]:
        return sorted({run for _, run, _ in self.partitions})


def old_run_folders(lake: DataLake) -> list[tuple[str, str, Path]]:
    """``(table, run id, folder)`` of every layout-1 run folder (``<table>/run_id=<id>``) of the data root."""
    found = []
    for name, spec in sorted(lake.tables.items()):
        table_dir = lake.table_dir(name)
        if spec.source != "parquet" or not table_dir.is_dir():
            continue
        check_real_folder(table_dir, "table folder")
        for entry in sorted(table_dir.iterdir()):
            if not entry.name.startswith(OLD_RUN_FOLDER_PREFIX):
                continue
            run_id = entry.name.removeprefix(OLD_RUN_FOLDER_PREFIX)
            if not is_valid_run_id(run_id):
                raise LakeError(
                    f"layout-1 folder {str(entry)!r} does not name a valid run id; move it out of the "
                    "data root, then upgrade again"
                )
            check_real_folder(entry, "partition folder")
            found.append((name, run_id, entry))
    return found


def upgrade_layout(lake: DataLake) -> LayoutUpgrade:
    """Bring the data root to the current layout (module docstring); a data root already there keeps its files
    (only the records of published parts and ``_layout.json`` are written where missing). Every name is checked
    before the first change: a file or folder the upgrade could not carry over raises, naming it, with nothing
    changed. Safe to interrupt and run again."""
    layout_version(lake.root)  # a newer layout raises
    copy = store_copy(lake.root)
    if copy is not None:  # every object, and the layout-1 files an interrupted upgrade moved here but not there
        copy.pull()
    report = LayoutUpgrade(lake.root)
    by_run: dict[str, list[tuple[str, Path]]] = {}
    for table, run_id, folder in old_run_folders(lake):
        by_run.setdefault(run_id, []).append((table, folder))
    for folders in by_run.values():
        for table, folder in folders:
            check_old_run_folder(folder)
            check_old_keys(lake, table, folder)
    unrecorded = _unrecorded_partitions(lake)
    for run_id, folders in sorted(by_run.items()):
        with run_writer(lake.root, run_id, ["ragen", "upgrade-lake"]), run_lock(lake, run_id):
            for table, folder in folders:
                _upgrade_run_folder(lake, table, run_id, folder, report)
            lake.publish_rewrite(run_id, every_iteration=True)  # a bucket: the new names, before the old go
    for run_id, partitions in sorted(unrecorded.items()):
        with run_writer(lake.root, run_id, ["ragen", "upgrade-lake"]), run_lock(lake, run_id):
            for folder in partitions:
                report.recorded += _record_partition(folder)
            lake.publish_rewrite(run_id, every_iteration=True)
    try:
        record_layout(lake.root)
    except OSError as exc:
        raise LakeError(f"cannot write {str(layout_file(lake.root))!r}: {exc.strerror or exc}") from exc
    if copy is not None:  # the bucket's layout-1 files, each published under its new name; the layout file last
        copy.drop_old_layout()
        copy.push_loose(None)
    return report


_MOVE_OUT = "move it out of the data root, then upgrade again (nothing was changed)"


def check_old_run_folder(folder: Path) -> None:
    """Before the first change: every entry of a layout-1 run folder is an ``iteration=<n>`` folder whose entries the
    upgrade can carry over (:func:`check_old_partition`); anything else raises, naming it."""
    for entry in sorted(folder.iterdir()):
        if ITERATION_FOLDER.fullmatch(entry.name) is None:
            raise LakeError(f"{str(entry)!r} is not a layout-1 iteration=<n> folder; {_MOVE_OUT}")
        check_real_folder(entry, "partition folder")
        check_old_partition(entry)


def check_old_partition(old: Path) -> None:
    """Every entry of a layout-1 partition is a regular file (no folder, link or device, hidden or not), every part
    file has a name the lake writes (``part-<name>.parquet``: the new layout's readers refuse any other), the marker
    is one (:func:`_old_marker`) and no two files take the same new name (:func:`_new_names`)."""
    for entry in sorted(old.iterdir()):
        try:
            regular = check_regular_file(entry, "file")
        except LakeError:
            regular = False
        if not regular:
            raise LakeError(
                f"{str(entry)!r} in the layout-1 partition {str(old)!r} is not a regular file (a folder, "
                f"a link or a device); {_MOVE_OUT}"
            )
        part_like = entry.name.startswith("part-") or entry.name.endswith(".parquet")
        if part_like and not entry.name.startswith(".") and PART_NAME.fullmatch(entry.name) is None:
            raise LakeError(
                f"part file {str(entry)!r} has a name of no form the lake writes (part-<letters, digits, "
                f"'.', '_', '-'>.parquet); rename it or {_MOVE_OUT}"
            )
    _new_names(old)


def check_old_keys(lake: DataLake, table: str, folder: Path) -> None:
    """Before the first change: in each partition of a layout-1 run folder, no two of the part files that readers
    take (those a compaction marker hides left out) hold rows of the same key: a copy, in the same bytes or
    re-encoded, would be recorded as published (:func:`ragen_core.storage.keys.check_files` names both files)."""
    for entry in sorted(folder.iterdir()):
        marker = _old_marker(entry)
        files = part_files(entry)
        if marker is not None and marker["merged"] in {path.name for path in files}:
            files = [path for path in files if path.name not in marker["replaces"]]
        check_files(lake.spec(table), files, lake.upgrades)


def _unrecorded_partitions(lake: DataLake) -> dict[str, list[Path]]:
    """The layout-2 partitions holding part files but no record of published parts, by run (checked to the layout
    first: names, no links; no two of the files a reader would take hold the same bytes or rows of the same key)."""
    found: dict[str, list[Path]] = {}
    for name, spec in sorted(lake.tables.items()):
        table_dir = lake.table_dir(name)
        if spec.source != "parquet" or not table_dir.is_dir():
            continue
        for entry in sorted(table_dir.iterdir()):
            run_id = entry.name.removeprefix(RUN_FOLDER_PREFIX)
            if not entry.name.startswith(RUN_FOLDER_PREFIX) or not is_valid_run_id(run_id):
                continue  # layout 1 (moved with its records), or no run's (the readers refuse it)
            for _, folder in iteration_folders(entry):
                if part_files(folder) and read_record(parts_record_of(folder)) is None:
                    _check_one_name_each(folder)
                    # a copy is never recorded as published: neither of the same bytes nor of the same keys
                    check_files(spec, trusted_parts(part_files(folder), spec, False), lake.upgrades)
                    found.setdefault(run_id, []).append(folder)
    return found


def _check_one_name_each(folder: Path) -> None:
    """No file of a partition without a record has two names there (a hard link would be recorded twice)."""
    seen: dict[tuple[int, int], Path] = {}
    for path in part_files(folder):
        found = os.lstat(path)
        first = seen.setdefault((found.st_dev, found.st_ino), path)
        if first != path:
            raise LakeError(
                f"part file {str(path)!r} is a second name (hard link) of {str(first)!r}: readers would "
                f"count its rows twice; {_MOVE_OUT}"
            )


def _record_partition(folder: Path) -> int:
    """Record the part files a partition of a data root written before the records holds; returns 1 (0 when a
    record appeared meanwhile)."""
    if read_record(parts_record_of(folder)) is not None:
        return 0
    record_parts(folder, {path.name: path.stat().st_size for path in part_files(folder)})
    return 1


def _upgrade_run_folder(lake: DataLake, table: str, run_id: str, folder: Path, report: LayoutUpgrade) -> None:
    """Move every ``iteration=<n>`` partition of one layout-1 run folder, then remove the folder (once empty)."""
    target_run = lake.run_partition_dir(table, run_id)
    target_run.mkdir(parents=True, exist_ok=True)
    check_real_folder(target_run, "partition folder")
    check_old_run_folder(folder)
    for entry in sorted(folder.iterdir()):
        iteration = int(ITERATION_FOLDER.fullmatch(entry.name).group(1))
        report.files += _upgrade_partition(entry, target_run, iteration)
        report.partitions.append((table, run_id, iteration))
    folder.rmdir()
    fsync_dir(folder.parent)


def _upgrade_partition(old: Path, target_run: Path, iteration: int) -> int:
    """Steps 1-3 of one partition; returns the number of files moved."""
    names = _new_names(old)
    new = target_run / iteration_folder_name(iteration)
    parts = {name: (old / source).stat().st_size for source, name in names.items() if PART_NAME.fullmatch(name)}
    if os.path.lexists(new):  # committed by an earlier, interrupted upgrade: check it, then finish
        check_real_folder(new, "partition folder")
        _check_moved(old, new, names)
        record_parts(new, parts)
    else:
        staging = upgrading_partition(new)
        if os.path.lexists(staging):
            check_real_folder(staging, "upgrade folder")
            shutil.rmtree(staging)
        staging.mkdir()
        for source, name in names.items():
            _second_name(old / source, staging / name)
        _write_marker(old, staging, names)
        fsync_dir(staging)
        record_parts(new, parts)  # before the partition appears (a record may name more, never fewer)
        _commit_partition(staging, new)
    _remove_old_partition(old)
    return len(names)


def _commit_partition(staging: Path, new: Path) -> None:
    """Step 2: the filled hidden folder becomes the partition (one rename: the commit point)."""
    os.replace(staging, new)
    fsync_dir(new.parent)


def _remove_old_partition(old: Path) -> None:
    """Step 3: delete the layout-1 partition, its marker last (while it is there, the merged file's new name can
    be derived from it, so an interrupted deletion is checked and finished by the next upgrade)."""
    for entry in sorted(old.iterdir(), key=lambda e: e.name == OLD_COMPACTION_MARKER):
        entry.unlink()
    old.rmdir()


def _new_names(old: Path) -> dict[str, str]:
    """The new name of every file of a layout-1 partition that is kept (the marker and hidden leftovers are not)."""
    names: dict[str, str] = {}
    for entry in sorted(old.iterdir()):
        if entry.name.startswith(".") or entry.name == OLD_COMPACTION_MARKER:
            continue
        if not check_regular_file(entry, "file"):
            continue
        names[entry.name] = new_part_name(entry.name) if PART_NAME.fullmatch(entry.name) else entry.name
    marker = _old_marker(old)
    if marker is not None and marker["merged"] in names:
        names[marker["merged"]] = merged_name([new_part_name(n) for n in marker["replaces"]])
    if len(set(names.values())) != len(names):
        raise LakeError(
            f"two files of {str(old)!r} would take the same layout-2 name; move the extra files out of "
            "the data root, then upgrade again"
        )
    return names


def new_part_name(old_name: str) -> str:
    """The layout-2 name of a layout-1 part file (``part-<stage>-<k>.parquet``)."""
    stem = old_name.removeprefix("part-").removesuffix(".parquet")
    stage, _, number = stem.rpartition("-")
    if stage and number.isdigit():
        return published_part_name(stage, int(number))
    return published_part_name(stem, 0)


def _old_marker(old: Path) -> dict | None:
    path = compaction_marker(old, old=True)
    if not check_regular_file(path, "compaction marker"):
        return None
    return check_marker(path, read_json(path), merged_name)


def _write_marker(old: Path, staging: Path, names: dict[str, str]) -> None:
    """The layout-1 marker, its names translated, as the new partition's marker."""
    marker = _old_marker(old)
    if marker is None:
        return
    replaces = [new_part_name(n) for n in marker["replaces"]]
    payload = {"merged": merged_name(replaces), "replaces": replaces, "rows": marker["rows"]}
    atomic_write_json(compaction_marker(staging), payload)


def _second_name(source: Path, target: Path) -> None:
    """``target`` as a second name of ``source`` (a hard link; a copy, flushed, where links are not supported)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copyfile(source, target)
        with open(target, "rb") as handle:
            os.fsync(handle.fileno())


def _check_moved(old: Path, new: Path, names: dict[str, str]) -> None:
    """Every file still in the old partition is in the new one under its new name, with the same size."""
    for source, name in names.items():
        moved = new / name
        if not check_regular_file(moved, "part file") or moved.stat().st_size != (old / source).stat().st_size:
            raise LakeError(
                f"{str(old / source)!r} is not in the upgraded partition {str(new)!r} (as {name!r}); nothing was "
                "deleted: move one of the two folders out of the data root, then upgrade again"
            )
