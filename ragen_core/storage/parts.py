"""Which part files of a partition readers see: the rule that makes compaction atomic for readers.

A partition folder (``<table>/run-<id>/iteration-<n>/``) holds ``part-*.parquet`` files. Compaction
(:mod:`ragen_core.storage.compaction`) merges them into one ``part-compacted-<digest>.parquet`` and records, *before*
that file appears, a marker ``.compaction.json`` = ``{"merged": <name>, "replaces": [<names>], "rows": <n>}``
(hidden: the folder shows the other tools that read it only Parquet files).

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
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ragen_core.storage.files import LakeError, read_json
from ragen_core.storage.layout import COMPACTION_MARKER, MERGED_PREFIX, compaction_marker
from ragen_core.storage.trust import check_marker, check_regular_file, check_replaced_rows

__all__ = ["COMPACTION_MARKER", "MERGED_PREFIX", "check_not_superseded", "merged_name", "read_marker", "superseded",
           "visible_parts"]  # fmt: skip


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


def visible_parts(files: Iterable[Path]) -> list[Path]:
    """The files of a listing that readers see (sorted), after the compaction rule of every partition folder."""
    by_folder: dict[Path, list[Path]] = {}
    for path in files:
        by_folder.setdefault(path.parent, []).append(path)
    visible: list[Path] = []
    for folder, listed in by_folder.items():
        hidden = superseded(folder, [p.name for p in listed])
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
