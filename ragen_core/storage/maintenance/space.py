"""Writes that failed for want of space: a full disk, a quota, or a file-size limit (``ulimit -f``) reached.

Such a failure reaches the run in many shapes: an ``OSError`` (ENOSPC, EDQUOT, EFBIG: Python ignores SIGXFSZ, so a
write past ``ulimit -f`` raises EFBIG), torch's checkpoint writer's ``RuntimeError`` ("unexpected pos": a write came
up short), SQLite's "database or disk is full", or only an HTTP 500 from the command's own Prefect server whose
database could not grow. :func:`space_failure` recognises each (by the error, else by the state of the run's folders:
no free space left, or a file at the size limit) and says what happened in one line, with what to do.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ragen_core.storage.files import LakeError, read_json
from ragen_core.storage.layout import manifest_file, prefect_home, run_dir, space_reserve_file, staging_dir

if TYPE_CHECKING:
    from ragen_core.storage.lake import DataLake

SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# the texts libraries put in place of the errno; "unexpected pos" is torch's writer finding a write came up short
_SPACE_TEXTS = (
    "no space left on device",
    "disk quota exceeded",
    "file too large",
    "database or disk is full",
    "unexpected pos",
)
LOW_SPACE_BYTES = 1 << 20  # less free space than this under the data root counts as a full disk
_WALK_LIMIT = 20_000  # entries looked at for a file at the size limit (a run's own folders: far fewer)


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from or while handling) is a write that found no space."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in SPACE_ERRNOS:
            return True
        if any(text in str(current).lower() for text in _SPACE_TEXTS):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def space_exhausted(root: Path, folders: Iterable[Path]) -> bool:
    """Whether the file system of the data root ``root`` has (almost) no free space left, or one of the files in
    ``folders`` has reached the process's file-size limit: what a failure that names no cause (an HTTP 500 of a
    Prefect server whose database could not grow) is then due to."""
    try:
        if shutil.disk_usage(root).free < LOW_SPACE_BYTES:
            return True
    except OSError:
        pass
    folders = [Path(f) for f in folders if Path(f).is_dir() and not Path(f).is_symlink()]
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit == resource.RLIM_INFINITY:
        return False
    seen = 0
    for folder in folders:
        for parent, _, names in os.walk(folder):
            for name in names:
                seen += 1
                try:
                    if os.lstat(os.path.join(parent, name)).st_size >= limit:
                        return True
                except OSError:
                    continue
                if seen > _WALK_LIMIT:
                    return False
    return False


SPACE_PREFIX = "the disk is full or a file-size limit was hit"
# what a running run holds back (written, so a file system that allocates on write counts it): released when a write
# finds no space, so that the manifest can still record the failure (its atomic write needs a new file)
RESERVE_BYTES = 1 << 20


def reserve_file(lake: DataLake, run_id: str) -> Path:
    """The file in which a running run holds back its space: in its run folder (no link on the way)."""
    return space_reserve_file(lake.run_dir(run_id))


def hold_reserve(path: Path) -> bool:
    """Hold :data:`RESERVE_BYTES` of the disk in the file ``path`` (never through a link); whether it is held. With
    no space left for it, nothing is held (a run starting on a full disk fails on its own writes, as it would)."""
    try:
        if os.lstat(path).st_size == RESERVE_BYTES:
            return True
    except FileNotFoundError:
        pass
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(bytes(RESERVE_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        return True
    except OSError:
        release_reserve(path)
        return False


def release_reserve(path: Path) -> None:
    """Give the held space back (for the failure record); nothing when none is held."""
    try:
        os.unlink(path)
    except OSError:
        pass


def space_message(run_id: str | None, what: str) -> str:
    """The one line that reports a write that found no space (``run_id`` None: nothing of a run was started)."""
    then = f"`ragen resume {run_id}`" if run_id else "run the command again"
    return f"{SPACE_PREFIX} while writing {what}: free space or raise the limit (ulimit -f), then {then}"


def space_limited(folder: Path) -> bool:
    """Whether writes under ``folder`` may fail for want of space: (almost) no free space there, or a file-size
    limit set for this process. For a failure whose files tell nothing (SQLite's "disk I/O error" of a database it
    could not grow, a file it then truncated)."""
    try:
        if shutil.disk_usage(folder).free < LOW_SPACE_BYTES:
            return True
    except OSError:
        pass
    return resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY


def written_what(exc: BaseException, where: dict | None) -> str:
    """What was being written: the file an error names, else the run's iteration and stage."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.filename:
            return repr(str(current.filename))
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    where = where or {}
    if where.get("iteration") is None:
        return "the run's files"
    stage = f", stage {where['stage']}" if where.get("stage") else ""
    return f"iteration {where['iteration']}{stage}"


def space_failure(root: Path, run_id: str, exc: BaseException, recorded_since: str | None = None) -> str | None:
    """The one line for a run stopped by ``exc`` when that was a want of space, else None: the run's manifest
    recorded it at or after ``recorded_since`` (an ISO time: this command's start; None: the manifest is not read)
    (the error that reached the caller may be a later one, such as the Prefect server's 500 when it then reports the
    failure), the error says so, or the run's folders show it (:func:`space_exhausted`). A want of space an earlier
    command recorded is not this failure's cause."""
    root = Path(root)
    recorded = None
    if recorded_since is not None:
        try:
            recorded = read_json(manifest_file(run_dir(root, run_id)), missing_ok=True)
        except LakeError:
            recorded = None
    error = recorded.get("error") if isinstance(recorded, dict) else None
    fresh = isinstance(recorded, dict) and str(recorded.get("updated_at", "")) >= str(recorded_since)
    if isinstance(error, str) and error.startswith(SPACE_PREFIX) and fresh:
        return error
    folders = [prefect_home(root, run_id), run_dir(root, run_id), staging_dir(root, run_id)]
    if out_of_space(exc) or space_exhausted(root, folders):
        return space_message(run_id, written_what(exc, None))
    return None
