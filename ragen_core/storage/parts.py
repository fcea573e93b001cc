"""Which part files of a partition readers see: the rule that makes compaction atomic for readers.

A partition folder (``<table>/run-<id>/iteration-<n>/``) holds ``part-*.parquet`` files. Compaction
(:mod:`ragen_core.storage.maintenance.compaction`) merges them into one ``part-compacted-<digest>.parquet`` and
records, *before* that file appears, a marker ``.compaction.json`` = ``{"merged": <name>, "replaces": [<names>],
"rows": <n>}`` (hidden: the folder shows the other tools that read it only Parquet files).

The reader rule: **list the part files first, then read the marker; when the marker's merged file is among the
listed files, skip the files it replaces.** The merged file becomes visible by one rename, after the marker is on
disk, so every listing that holds the merged file was taken when the marker already named what it replaces: a
reader sees the complete old set or the merged file, never both and never part of either. A marker whose merged
file is absent (a compaction that stopped before its rename) changes nothing.

A marker is a file of the lake like any other, so it is checked before it hides anything
(:mod:`ragen_core.storage.layout`): plain names of its own folder, the merged name derived from the replaced ones,
and row counts that add up (the merged file holds the marker's count; the replaced files still present hold no more).
A marker that breaks a rule raises a :class:`LakeError` naming it: every read of the table fails, nothing is hidden
and nothing is deleted.

**Readers take only the parts the lake published.** Each partition has a record,
``_commits/<run>/parts/<table>/iteration=<n>.json`` = ``{"parts": {<name>: <bytes>}}``, of the part files the lake
put there: a publish (:meth:`DataLake.publish`), a compaction's merged file and an upgrade add their names and sizes
*before* the files appear (one rename each), a compaction's deletions and a redo's discards take them out after the
files are gone. So every listing of a partition followed by a reading of its record finds each file the lake put
there in the record with its size. A file that is not (a copy under a valid-looking name, a hard link under another
name, a file replaced by another of a different size) is refused in one line naming it (:func:`check_published`):
the table's readers fail instead of counting its rows twice. A file that the readers themselves refuse anyway (a
damaged one, rows of another partition) is left to them, so their message says what is wrong with it. A data root
written before the records were kept reads a partition without a record whole, until ``ragen upgrade-lake`` writes
its records (``part_records`` in ``_layout.json``: from then on a partition without a record is refused).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ragen_core.storage.files import LakeError, VanishedFileError, atomic_write_json, read_json
from ragen_core.storage.layout import (
    COMPACTION_MARKER,
    MERGED_PREFIX,
    PART_NAME,
    compaction_marker,
    parts_record_of,
)
from ragen_core.storage.trust import (
    check_footer,
    check_marker,
    check_real_folders,
    check_regular_file,
    check_replaced_rows,
    footer,
    part_files,
)
from schemas.tables import TableSpec

__all__ = ["COMPACTION_MARKER", "MERGED_PREFIX", "StrayPartError", "check_not_superseded", "check_published",
           "merged_name", "read_marker", "read_record", "record_parts", "superseded", "visible_parts"]  # fmt: skip


def merged_name(names: list[str]) -> str:
    """The deterministic name of the file that merges ``names``."""
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
    return f"{MERGED_PREFIX}{digest}.parquet"


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The compaction marker of a partition folder (held to the marker rules), or None when it has none."""
    path = compaction_marker(Path(folder))
    if not check_regular_file(path, "compaction marker"):
        return None
    try:
        payload = read_json(path, missing_ok=True)
    except LakeError as exc:
        raise LakeError(f"cannot read compaction marker {str(path)!r} (damaged?): {exc}") from exc
    return None if payload is None else check_marker(path, payload, merged_name)


def superseded(folder: Path, listed: Iterable[str]) -> set[str]:
    """Names among ``listed`` (a listing of ``folder`` taken before this call) that a compaction replaced; a marker
    that would hide rows the merged file does not hold raises instead."""
    names = set(listed)
    if len(names) < 2:
        return set()  # one file is never hidden: either it is the merged file or the marker is inert
    marker = read_marker(folder)
    if marker is None or marker["merged"] not in names:
        return set()
    hidden = set(marker["replaces"]) & names
    check_replaced_rows(compaction_marker(Path(folder)), marker, [Path(folder) / n for n in sorted(hidden)])
    return hidden


def visible_parts(files: Iterable[Path], spec: TableSpec, records_required: bool) -> list[Path]:
    """The files of a listing of ``spec``'s table that readers see (sorted), after the compaction rule of every
    partition folder; each of them one the lake published there (:func:`check_published`; ``records_required``:
    the data root keeps a record of every partition)."""
    by_folder: dict[Path, list[Path]] = {}
    for path in files:
        by_folder.setdefault(path.parent, []).append(path)
    visible: list[Path] = []
    checked: set[Path] = set()  # the records' folders found real (one per table of a run: checked once)
    for folder, listed in by_folder.items():
        hidden = superseded(folder, [p.name for p in listed])  # a forged marker raises first, naming it
        check_published(folder, listed, spec, records_required, checked)
        visible += [p for p in listed if p.name not in hidden]
    return sorted(visible)


def check_not_superseded(folder: Path, name: str) -> None:
    """Refuse to publish ``name`` into a compacted partition whose marker hides that name (it would be invisible)."""
    marker = read_marker(folder)
    if marker is None or name not in marker["replaces"]:
        return
    if (Path(folder) / marker["merged"]).is_file():
        raise LakeError(
            f"{str(Path(folder) / name)!r} was compacted into {marker['merged']!r}; a committed, compacted iteration "
            "cannot be re-published (start a new run or remove this one)"
        )


# -- the record of published parts ---------------------------------------------------------------------------------
class StrayPartError(LakeError):
    """A part file that the lake did not publish where it lies (:func:`check_published`)."""


_STRAY = ("readers would count its rows besides the published ones (a copy, a second name of a file, a planted "
          "file); move it out of the data root, then try again")  # fmt: skip


def read_record(path: Path) -> dict[str, int] | None:
    """A partition's record of published parts (``{name: bytes}``), held to its form; None when there is none (a
    link, or anything but a regular file, in its place raises: :func:`ragen_core.storage.files.read_json`)."""
    payload = read_json(path, missing_ok=True)
    if payload is None:
        return None
    parts = payload.get("parts") if isinstance(payload, dict) else None
    if not isinstance(parts, dict) or not all(
        isinstance(name, str) and PART_NAME.fullmatch(name) and type(size) is int and size >= 0
        for name, size in parts.items()
    ):
        raise LakeError(f"record of published parts {str(path)!r} is not {{\"parts\": {{<part file>: <bytes>}}}}; it "
                        "was changed by hand or planted: move it out of the data root, then try again")  # fmt: skip
    return parts


def _record_path(folder: Path, checked: set[Path] | None = None) -> Path:
    """The record of a partition folder, every folder on the way to it a real one (no link out of the data root;
    ``checked``: folders found real before, by this caller)."""
    path = parts_record_of(folder)
    if checked is None or path.parent not in checked:
        check_real_folders(Path(folder).parent.parent.parent, path.parent, "folder of the records of published parts")
        if checked is not None:
            checked.add(path.parent)
    return path


def _size(path: Path) -> int | None:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return None


def check_published(
    folder: Path, listed: list[Path], spec: TableSpec, records_required: bool, checked: set[Path] | None = None
) -> None:
    """Every file of ``listed`` (a listing of the partition ``folder`` taken before this call) is one the lake
    published there: named in the partition's record, with its size (module docstring). A file that is not raises a
    :class:`LakeError` naming it, unless the readers refuse it anyway (damaged, rows of another partition: they say
    so); a partition without a record raises when ``records_required`` (``checked``: :func:`_record_path`)."""
    path = _record_path(folder, checked)
    record = read_record(path)
    if record is None and not records_required:
        return  # written before the records were kept: read whole (``ragen upgrade-lake`` records it)
    for file in listed:
        size = _size(file)
        if size is None:
            continue  # removed since the listing (a compaction's last step, a redo): the readers list again
        if record is not None and record.get(file.name) == size:
            continue
        record = read_record(path)  # a redo may have published the same name again since the record was read
        size = _size(file)
        if size is None or record is not None and record.get(file.name) == size:
            continue
        _refuse(file, spec, path, record, size)


def _refuse(file: Path, spec: TableSpec, record_path: Path, record: Mapping[str, int] | None, size: int) -> None:
    """Raise for a part file that is not one the lake published; what the readers refuse in any file (rows of
    another partition, a missing NOT NULL column) is said as they say it, and a damaged file is left to them."""
    try:
        metadata = footer(file)
    except VanishedFileError:
        raise
    except LakeError:
        return  # damaged: every reader fails on it, naming it as damaged
    try:
        check_footer(file, spec, metadata)
    except VanishedFileError:
        raise
    except LakeError as exc:
        raise StrayPartError(str(exc)) from exc
    if record is None:
        problem = (f"lies in a partition without a record of the parts the lake published there "
                   f"({str(record_path)!r} is missing), so none of its files can be told from a copy; move the "
                   "copies out of the data root, then run `ragen upgrade-lake` to record the rest")  # fmt: skip
        raise StrayPartError(f"part file {str(file)!r} {problem}")
    if file.name in record:
        problem = (f"holds {size} bytes, but the lake published {record[file.name]} under that name "
                   f"({str(record_path)!r}): it was replaced; {_STRAY}")  # fmt: skip
        raise StrayPartError(f"part file {str(file)!r} {problem}")
    problem = f"is not among the parts the lake published in its partition (recorded in {str(record_path)!r})"
    raise StrayPartError(f"part file {str(file)!r} {problem}; {_STRAY}")


def record_parts(folder: Path, added: Mapping[str, int], removed: Iterable[str] = ()) -> None:
    """Record that the part files ``added`` (name: bytes) are about to appear in the partition ``folder`` (called
    before their renames) and that ``removed`` are gone (after their deletion). A partition that holds part files but
    no record was written before the records were kept: it stays without one (``ragen upgrade-lake`` records it)."""
    path = _record_path(folder)
    record = read_record(path)
    if record is None:
        present = {p.name for p in part_files(folder)} if Path(folder).is_dir() else set()
        if present - set(added) - set(removed):
            return
        record = {}
    record.update(added)
    for name in removed:
        record.pop(name, None)
    atomic_write_json(path, {"parts": dict(sorted(record.items()))})
