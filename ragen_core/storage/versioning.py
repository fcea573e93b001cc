"""The data root's lake layout version: ``_layout.json`` = ``{"layout_version": n, "part_records": true}`` (the
names of each layout: :mod:`ragen_core.storage.layout`; the upgrade from an older one:
:mod:`ragen_core.storage.maintenance.upgrade`).

A data root gets the file with its first published part file (or from the upgrade). Readers refuse a layout newer
than this code; writers also refuse to publish a run whose rows still lie in layout-1 folders (readers refuse those
folders in their listing, :func:`ragen_core.storage.layout.run_folders`). ``part_records``: every partition of the
data root has the record of the part files the lake published into it (:mod:`ragen_core.storage.parts`), so a
partition without one is refused; a data root written before the records were kept has no such key until
``ragen upgrade-lake`` has written the records of its partitions (its partitions without a record are read whole
until then)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from ragen_core.storage.files import LakeError, atomic_write_json, read_json
from ragen_core.storage.layout import LAYOUT_VERSION, layout_file, old_layout_error, old_partition_dir
from ragen_core.storage.trust import check_regular_file


def layout_version(root: Path) -> int | None:
    """The layout version recorded in the data root (None when it has no ``_layout.json`` yet); a version newer
    than this code raises."""
    return layout_state(root)[0]


def layout_state(root: Path) -> tuple[int | None, bool]:
    """The layout version recorded in the data root (None when it has no ``_layout.json`` yet; a version newer than
    this code raises) and whether every partition has its record of published parts (``part_records``)."""
    path = layout_file(root)
    if not check_regular_file(path, "layout file"):
        return None, False
    payload = read_json(path)
    version = payload.get("layout_version") if isinstance(payload, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise LakeError(  # the text a data root of this layout records, with its records of published parts kept on
            f"layout file {str(path)!r} has no integer layout_version; it was changed by hand: write "
            f"{json.dumps(layout_payload())} into it if the data root is of this layout, then run `ragen "
            "upgrade-lake`, which records the published parts of any partition that has no record of them"
        )
    if version > LAYOUT_VERSION:
        raise LakeError(
            f"data root {str(root)!r} has lake layout {version}, but this ragen-flows only knows layouts "
            f"up to {LAYOUT_VERSION}: upgrade ragen-flows (pip install -U ragen-flows) to use it"
        )
    return version, payload.get("part_records") is True


def layout_payload(part_records: bool = True) -> dict[str, object]:
    """What ``_layout.json`` says: the current version; ``part_records``: every partition has its record of published
    parts."""
    payload: dict[str, object] = {"layout_version": LAYOUT_VERSION}
    if part_records:
        payload["part_records"] = True
    return payload


def record_layout(root: Path, part_records: bool = True) -> None:
    """Write ``_layout.json`` (:func:`layout_payload`, atomically)."""
    atomic_write_json(layout_file(root), layout_payload(part_records))


def check_publishable(root: Path, table_dirs: Iterable[Path], run_id: str) -> None:
    """Before publishing ``run_id``'s rows: the data root's layout is this code's (recorded when it has none yet),
    and none of ``table_dirs`` holds the run's rows in a layout-1 folder (raises, naming the upgrade)."""
    table_dirs = list(table_dirs)
    if layout_version(root) is None:  # a new data root (or one whose tables were written without the file)
        record_layout(root, part_records=not any(_holds_anything(folder) for folder in table_dirs))
    for table_dir in table_dirs:
        old = old_partition_dir(table_dir, run_id)
        if os.path.lexists(old):
            raise old_layout_error(root, old)


def _holds_anything(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(True for _ in entries)
    except (FileNotFoundError, NotADirectoryError):
        return False
