"""The compaction markers and the records of published parts: what each says and how the writers keep it. The
readers read them back and apply them in the read path (:mod:`ragen_core.storage.reader`).

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
name, a file replaced by another of a different size) is refused in one line naming it
(:func:`ragen_core.storage.reader.check_published`): the table's readers fail instead of counting its rows twice. A
file that the readers themselves refuse anyway (a damaged one, rows of another partition) is left to them, so their
message says what is wrong with it. A data root written before the records were kept reads a partition without a
record whole, until ``ragen upgrade-lake`` writes its records (``part_records`` in ``_layout.json``: from then on a
partition without a record is refused).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from ragen_core.storage.files import LakeError, atomic_write_json
from ragen_core.storage.layout import COMPACTION_MARKER, MERGED_PREFIX, merged_name
from ragen_core.storage.reader import read_marker, read_record, record_file
from ragen_core.storage.trust import part_files

__all__ = ["COMPACTION_MARKER", "MERGED_PREFIX", "check_not_superseded", "merged_name", "record_parts"]


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
def record_parts(folder: Path, added: Mapping[str, int], removed: Iterable[str] = ()) -> None:
    """Record that the part files ``added`` (name: bytes) are about to appear in the partition ``folder`` (called
    before their renames) and that ``removed`` are gone (after their deletion). A partition that holds part files but
    no record was written before the records were kept: it stays without one (``ragen upgrade-lake`` records it)."""
    path = record_file(folder)
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
