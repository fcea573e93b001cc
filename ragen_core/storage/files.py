"""File-level I/O of the lake: atomic writes and reads that fail with a :class:`LakeError` naming the file."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragen_core.faults import maybe_fail
from schemas.tables import TableSpec
from schemas.versions import UPGRADES, NewerSchemaError, SchemaVersionError, UpgradeRegistry, upgrade

_UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f]")


class LakeError(RuntimeError):
    """A stored file cannot be read or the lake is in a state the caller did not expect."""


class VanishedFileError(LakeError):
    """A file listed a moment ago is gone when it is read: a writer removed or replaced it after the listing (a
    compaction deleting the parts its merged file replaced, a redo discarding a stage's files, a run's removal).
    That is the writer's atomic step, never damage: readers list the partition again and read what is there then
    (:data:`VANISHED_ATTEMPTS`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"Parquet file {str(path)!r} vanished after it was listed: another process removed or replaced it (a "
            "compaction, a redone stage, a run's removal) while it was read; try again"
        )
        self.path = Path(path)


# how often a reader lists a partition again when a file it listed vanished: each time needs a writer to have
# removed a file of it since the last listing, and a partition settles after one such step (the merged file of a
# compaction stays), so the bound is met only by a writer removing files without end
VANISHED_ATTEMPTS = 20


def check_name(kind: str, name: str) -> str:
    """``name`` if it can be one path component (run ids, stage names); else a :class:`LakeError`."""
    if not name or name in (".", "..") or name.startswith(".") or _UNSAFE_NAME.search(name):
        raise LakeError(f"{kind} {name!r} cannot name a folder: use letters, digits, '-', '_' or '.', not leading '.'")
    return name


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (renames, deletions) to disk."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary name, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` atomically."""
    atomic_write_bytes(Path(path), json.dumps(payload, indent=2, sort_keys=True, default=str).encode())


def atomic_write_parquet(path: Path, table: pa.Table, before_rename: Callable[[int], None] | None = None) -> None:
    """Write ``table`` to ``path`` atomically (temporary name, fsync, rename); ``before_rename`` is called with the
    file's size just before the rename (a compaction records its merged file there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    maybe_fail("persist", "mid_write")  # a crash here leaves only the temporary file, which readers never list
    if before_rename is not None:
        before_rename(os.stat(tmp).st_size)
    os.replace(tmp, path)


TRASH_PREFIX = ".old-"  # a folder or file being deleted: renamed to this hidden name first


def discard(path: Path) -> None:
    """Delete ``path`` (file or folder) so that readers stop seeing it at once: rename it to a hidden name in the
    same folder, then delete that (a crash in between leaves only a hidden leftover, which no reader lists)."""
    trash = path.with_name(TRASH_PREFIX + path.name)
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)
    os.replace(path, trash)
    if trash.is_dir() and not trash.is_symlink():  # a link is removed itself, never what it points to
        shutil.rmtree(trash)
    else:
        trash.unlink()


# the lake's JSON files (manifests, markers, a stage's result) are kilobytes; a planted one is refused by its size
# before it is read, and by its nesting while it is parsed, instead of filling the memory or the stack
MAX_JSON_BYTES = 64 * 2**20


def read_json(path: Path, missing_ok: bool = False) -> Any:
    """Read one JSON file of the lake: a regular file (no link followed, no FIFO waited on) of at most
    :data:`MAX_JSON_BYTES`. A damaged, oversized or too deeply nested file raises :class:`LakeError` naming it;
    ``missing_ok``: None for a file that is not there."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise LakeError(f"cannot read JSON file {str(path)!r}: it is not there") from None
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise LakeError(f"cannot read JSON file {str(path)!r}: {reason}; the lake reads only its own files") from None
    with os.fdopen(descriptor, "rb") as handle:
        found = os.fstat(handle.fileno())
        problem = None if stat.S_ISREG(found.st_mode) else "it is not a regular file"
        if found.st_size > MAX_JSON_BYTES:
            problem = f"it holds {found.st_size:,} bytes, more than the {MAX_JSON_BYTES:,} any file of the lake needs"
        if problem:
            raise LakeError(f"cannot read JSON file {str(path)!r}: {problem}; move it out of the data root")
        try:
            return json.loads(handle.read(MAX_JSON_BYTES + 1))
        except RecursionError:
            raise LakeError(
                f"cannot read JSON file {str(path)!r}: it is nested too deeply to be a file of the "
                "lake; move it out of the data root"
            ) from None
        except (OSError, ValueError) as exc:
            raise LakeError(f"cannot read JSON file {str(path)!r} (damaged or truncated?): {exc}") from exc


@contextmanager
def parquet_errors(path: Path) -> Iterator[None]:
    """Around a read of the Parquet file ``path``: a file removed since it was listed raises
    :class:`VanishedFileError` (the caller lists again), a damaged one :class:`LakeError` naming it."""
    try:
        yield
    except FileNotFoundError as exc:
        raise VanishedFileError(path) from exc
    except (pa.ArrowException, OSError) as exc:
        raise LakeError(f"cannot read Parquet file {str(path)!r} (damaged or truncated?): {exc}") from exc


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read one Parquet file as stored (``columns``: only those); a damaged file raises :class:`LakeError` naming
    it (:func:`parquet_errors`)."""
    with parquet_errors(path):
        return pq.read_table(path, columns=columns)


def read_table_file(path: Path, spec: TableSpec, upgrades: UpgradeRegistry = UPGRADES) -> pa.Table:
    """Read one file of ``spec``'s table in the current schema, upgrading an older ``schema_version``
    (:mod:`schemas.versions`); a damaged, foreign or too-new file raises :class:`LakeError` naming it."""
    table = read_parquet(path)
    try:
        return upgrade(table, spec, upgrades)
    except NewerSchemaError as exc:
        raise LakeError(f"cannot read {str(path)!r}: {exc}") from exc
    except SchemaVersionError as exc:
        raise LakeError(f"cannot read {str(path)!r} as table {spec.name!r}: {exc}") from exc


def damaged_files(paths: list[Path]) -> list[Path]:
    """Those of ``paths`` whose Parquet footer cannot be read (a cheap probe: truncation, foreign bytes)."""
    bad = []
    for path in paths:
        try:
            pq.read_metadata(path)
        except (pa.ArrowException, OSError):
            bad.append(path)
    return bad
