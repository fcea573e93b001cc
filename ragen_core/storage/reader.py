"""The read path of the lake, in one pass: a Parquet table's published rows, listed, held to the lake's rules and read.

``DataLake.read_table`` reads a table (of one run, of one iteration) in three steps, each here:

1. **list** (:func:`visible_files`, through ``DataLake.partition_files``): the data root's layout is this code's
   (:func:`~ragen_core.storage.versioning.layout_state`, which also says whether every partition keeps its record of
   published parts), then the table folder is walked entry by entry by the folder rules (:func:`list_parts`:
   ``run-<id>/iteration-<n>/part-*.parquet``, plain names, no links; :mod:`ragen_core.storage.trust`);
2. **check** each partition's listing in one place (:func:`trusted_parts`): the compaction rule (the merged file hides
   the files its marker replaces; a marker that would hide rows raises, :func:`superseded`) and the record of
   published parts (a stray file, a copy, a second name or a replaced file raises, naming it:
   :func:`check_published`), each read back here (:func:`read_marker`, :func:`read_record`). How the writers keep
   them is :mod:`ragen_core.storage.parts`';
3. **read** each partition whole (:func:`read_rows`, :func:`read_part`): every file in the table's current schema
   (an older ``schema_version`` upgraded, :func:`~ragen_core.storage.files.read_table_file`), its rows those of its
   folder's run and iteration, its NOT NULL columns without nulls (:func:`~ragen_core.storage.trust.check_rows`), and
   no two rows of the partition with the same key (:func:`~ragen_core.storage.keys.check_unique_keys`: a copy in
   other bytes, which the records and the byte comparison let through).

A file that vanishes meanwhile was removed by a writer's atomic step (a compaction deleting the parts its merged file
replaced, a redo discarding a stage, a run's removal), never damage: a listing that finds one lists again, and a
partition one of whose files vanished before it was read is listed again alone (:func:`relist`) and read whole from
the fresh listing (the merged file instead of its parts; nothing, once removed). A partition is read whole or not at
all, never in part and never twice. The DuckDB views (:mod:`ragen_core.storage.catalog`) list through the same
:func:`visible_files`.
"""

from __future__ import annotations

import filecmp
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ragen_core.storage.files import VANISHED_ATTEMPTS, LakeError, VanishedFileError, read_json, read_table_file
from ragen_core.storage.keys import check_unique_keys
from ragen_core.storage.layout import (
    PART_NAME,
    compaction_marker,
    merged_name,
    partition_dir,
    parts_record_of,
    table_dir,
)
from ragen_core.storage.names import validate_run_id
from ragen_core.storage.trust import (
    check_footer,
    check_marker,
    check_real_folder,
    check_real_folders,
    check_regular_file,
    check_replaced_rows,
    check_rows,
    footer,
    iteration_folders,
    part_files,
    partition_of,
    run_folders,
)
from ragen_core.storage.versioning import layout_state
from schemas.tables import TableSpec
from schemas.versions import UPGRADES, UpgradeRegistry

if TYPE_CHECKING:
    from ragen_core.storage.lake import DataLake


# -- 1. list --------------------------------------------------------------------------------------------------------
def visible_files(root: Path, spec: TableSpec, run_id: str | None = None, iteration: int | None = None) -> list[Path]:
    """The published part files of ``spec``'s table that readers see (sorted; of one run, of one iteration): the
    listing held to the layout (:func:`list_parts`), each partition's files checked (:func:`trusted_parts`). A run id
    is never part of a pattern: one run's files are listed from its own folder. A file that vanishes while the listing
    is checked (a compaction's merged file, by a run's removal) makes it list again."""
    if run_id is not None:
        validate_run_id(run_id)
    records = layout_state(root)[1]  # a newer layout raises; a folder of layout 1 raises in the listing
    for attempt in range(VANISHED_ATTEMPTS):
        try:
            checked: set[Path] = set()  # the records' folders found real (one per table of a run: checked once)
            listing = by_partition(list_parts(table_dir(root, spec.name), run_id, iteration))
            return sorted(path for files in listing for path in trusted_parts(files, spec, records, checked))
        except VanishedFileError:
            if attempt + 1 == VANISHED_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def list_parts(table_folder: Path, run_id: str | None = None, iteration: int | None = None) -> list[Path]:
    """Every part file of a table (of one run, of one iteration), by the folder rules
    (:mod:`ragen_core.storage.trust`): a listing walked entry by entry, never a pattern, never through a link."""
    if run_id is None:
        runs = list(run_folders(table_folder)) if table_folder.exists() or table_folder.is_symlink() else []
    else:
        check_real_folder(table_folder, "table folder")
        runs = [(run_id, partition_dir(table_folder, run_id))]
    files: list[Path] = []
    for _, run_folder in runs:
        for number, folder in iteration_folders(run_folder):
            if iteration is None or number == int(iteration):
                files += part_files(folder)
    return files


def by_partition(files: list[Path]) -> list[list[Path]]:
    """A listing of part files as the listings of their partition folders (in the order of their first file; a
    sorted listing keeps its order)."""
    groups: dict[Path, list[Path]] = {}
    for path in files:
        groups.setdefault(path.parent, []).append(path)
    return list(groups.values())


def relist(lake: DataLake, spec: TableSpec, files: list[Path]) -> list[Path]:
    """The visible files of the partition of ``files`` (one partition's listing) now: a fresh listing of that
    partition alone, by the same rules, for a reader that found one of them gone."""
    return lake.partition_files(spec.name, *partition_of(files[0]))


# -- 2. check -------------------------------------------------------------------------------------------------------
def trusted_parts(
    listed: list[Path], spec: TableSpec, records_required: bool, checked: set[Path] | None = None
) -> list[Path]:
    """The files of one partition's listing that readers see: the trust checks of a partition, in one place. The
    compaction rule first (:func:`superseded`: a forged marker raises, naming it), then every listed file is one the
    lake published there (:func:`check_published`; ``records_required``: the data root keeps a record of every
    partition; ``checked``: :func:`record_file`)."""
    if not listed:
        return []
    folder = listed[0].parent
    hidden = superseded(folder, [p.name for p in listed])
    check_published(folder, listed, spec, records_required, checked)
    visible = [p for p in listed if p.name not in hidden]
    check_no_copies(visible)
    return visible


def check_no_copies(files: list[Path]) -> None:
    """No two files of one partition's visible set hold the same bytes: a part copied under a new part name counts
    its rows twice, whatever a record says of it (a forged record, or one written after the copy was made by
    ``ragen upgrade-lake``). Only files of equal size are compared, byte for byte."""
    by_size: dict[int, list[Path]] = {}
    for path in files:
        by_size.setdefault(path.stat().st_size, []).append(path)
    for same in (group for group in by_size.values() if len(group) > 1):
        for index, path in enumerate(same):
            original = next((other for other in same[:index] if filecmp.cmp(other, path, shallow=False)), None)
            if original is not None:
                raise StrayPartError(
                    f"part file {str(path)!r} is a byte-for-byte copy of {str(original)!r} in the same partition: "
                    f"{_STRAY}"
                )


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
        raise LakeError(
            f'record of published parts {str(path)!r} is not {{"parts": {{<part file>: <bytes>}}}}; it '
            "was changed by hand or planted: move it out of the data root, then try again"
        )
    return parts


def record_file(folder: Path, checked: set[Path] | None = None) -> Path:
    """The record of a partition folder, every folder on the way to it a real one (no link out of the data root;
    ``checked``: folders found real before, by this caller)."""
    path = parts_record_of(folder)
    if checked is None or path.parent not in checked:
        check_real_folders(Path(folder).parent.parent.parent, path.parent, "folder of the records of published parts")
        if checked is not None:
            checked.add(path.parent)
    return path


class StrayPartError(LakeError):
    """A part file that the lake did not publish where it lies (:func:`check_published`)."""


_STRAY = (
    "readers would count its rows besides the published ones (a copy, a second name of a file, a planted "
    "file); move it out of the data root, then try again"
)


def check_published(
    folder: Path, listed: list[Path], spec: TableSpec, records_required: bool, checked: set[Path] | None = None
) -> None:
    """Every file of ``listed`` (a listing of the partition ``folder`` taken before this call) is one the lake
    published there: named in the partition's record, with its size (:mod:`ragen_core.storage.parts`). A file that is
    not raises a :class:`LakeError` naming it, unless the readers refuse it anyway (damaged, rows of another partition:
    they say so); a partition without a record raises when ``records_required`` (``checked``:
    :func:`record_file`)."""
    path = record_file(folder, checked)
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


def _size(path: Path) -> int | None:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return None


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
        problem = (
            f"lies in a partition without a record of the parts the lake published there "
            f"({str(record_path)!r} is missing), so none of its files can be told from a copy; move the "
            "copies out of the data root, then run `ragen upgrade-lake` to record the rest"
        )
        raise StrayPartError(f"part file {str(file)!r} {problem}")
    if file.name in record:
        problem = (
            f"holds {size} bytes, but the lake published {record[file.name]} under that name "
            f"({str(record_path)!r}): it was replaced; {_STRAY}"
        )
        raise StrayPartError(f"part file {str(file)!r} {problem}")
    problem = f"is not among the parts the lake published in its partition (recorded in {str(record_path)!r})"
    raise StrayPartError(f"part file {str(file)!r} {problem}; {_STRAY}")


# -- 3. read --------------------------------------------------------------------------------------------------------
def read_rows(lake: DataLake, spec: TableSpec, files: list[Path]) -> pa.Table:
    """The rows of ``spec``'s visible ``files`` (``lake.partition_files``: steps 1 and 2) in the table's current
    schema, read one partition at a time, each partition whole (:func:`_read_partition`)."""
    tables: list[pa.Table] = []
    for partition in by_partition(files):
        tables += _read_partition(lake, spec, partition)
    return pa.concat_tables(tables) if tables else spec.arrow_schema.empty_table()


def _read_partition(lake: DataLake, spec: TableSpec, files: list[Path]) -> list[pa.Table]:
    """The tables of one partition's visible ``files``, listed again while one of them vanishes (a concurrent
    compaction deleted the parts it had merged, a redo discarded a stage): read whole from the fresh listing."""
    for attempt in range(VANISHED_ATTEMPTS):
        try:
            tables = [read_part(path, spec, lake.upgrades) for path in files]
            check_unique_keys(spec, list(zip(files, tables, strict=True)))  # every row once, by its key
            return tables
        except VanishedFileError:
            if attempt + 1 == VANISHED_ATTEMPTS:
                raise
        except LakeError:
            if attempt + 1 == VANISHED_ATTEMPTS or all(f.exists() for f in files):
                raise
        files = relist(lake, spec, files)
        if not files:
            return []
    raise AssertionError("unreachable: the last attempt returns or raises")


def read_part(path: Path, spec: TableSpec, upgrades: UpgradeRegistry = UPGRADES) -> pa.Table:
    """One part file in the table's current schema, refused when its rows are not its folder's run and iteration
    (or a NOT NULL column holds nulls)."""
    table = read_table_file(path, spec, upgrades)
    check_rows(path, table, spec)
    return table
