"""One writer per run: an exclusive lock on ``runs/<run_id>/writer.lock``, held by ``train``, ``resume``,
``retrain`` and ``eval`` for the whole run.

The lock is ``flock`` on an open file descriptor, so the kernel drops it when the holding process dies, whatever
kills it: a killed holder never blocks the next attempt. The file also holds a JSON record of the holder (pid, host,
user, command, start time), written after the lock is taken and cleared when it is released. A record found in a
file whose lock is free was therefore left by a holder that died: the new holder takes over and reports it.

The lock belongs to the head process of a run: the descriptor is not inherited by the processes it launches (an
update group started by torchrun or the DeepSpeed launcher), and nested acquisitions of the same run in one process
(the CLI, then the flow it calls) share the one lock. On a data root shared over NFS the lock works where the NFS
server supports locking (Linux maps ``flock`` onto NFS byte-range locks). Because some shared filesystems accept
``flock`` silently as a lock of one host, a writer also holds the run's lease (:mod:`ragen_core.storage.lease`),
which holds across hosts on any of them; a writer whose lease was taken over stops before its next commit.

Beside it, a run's housekeeping lock (``_locks/<run_id>.lock``, :func:`run_lock`): held by whatever rewrites or
removes a run's committed files (compaction, removal, the layout upgrade) and by a resume while it reopens an
iteration; a second holder fails at once.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragen_core.storage.files import LakeError
from ragen_core.storage.layout import housekeeping_lock_file, manifest_file, writer_lease_file, writer_lock_file
from ragen_core.storage.lease import Lease, claim, pid_alive, read_lease, stale
from ragen_core.storage.storecopy import store_copy
from ragen_core.storage.trust import check_real_folder, check_real_folders, check_regular_file

if TYPE_CHECKING:
    from ragen_core.storage.lake import DataLake

LOCK_ATTEMPTS = 20
HOLDER_BYTES = 64 * 1024


class RunLockedError(LakeError):
    """Another live process writes this run; the message names it and says how to proceed."""


@dataclass
class RunLock:
    """A held writer lock. ``taken_over`` is the record of a holder that died without releasing it, if any."""

    run_id: str
    path: Path
    descriptor: int
    holder: dict[str, Any]
    taken_over: dict[str, Any] | None = None
    lease: Lease | None = None  # the half that holds across hosts
    store_lease: Any = None  # a data root in an object store: the run's lease object there (``storelease``)


_held: dict[Path, RunLock] = {}  # this process's locks, by file: a run has one taker per process
_held_guard = threading.Lock()


def lock_path(root: Path, run_id: str) -> Path:
    """The writer lock file of ``run_id`` under the data root ``root``."""
    return writer_lock_file(Path(root), run_id)


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder record in a lock file (None when the file is absent, empty or not a record)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(HOLDER_BYTES)  # a record is a few hundred bytes: a planted giant is not read whole
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        record = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError):  # not a record (damaged, planted, nested without end)
        return None
    return record if isinstance(record, dict) else None


def holder_record(run_id: str, command: list[str] | None = None) -> dict[str, Any]:
    """Who takes the lock: this process."""
    return {
        "run_id": run_id,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "user": getpass.getuser(),
        "command": " ".join(command or sys.argv),
        "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def locked_message(run_id: str, path: Path, holder: dict[str, Any] | None) -> str:
    """Why the run cannot be written now, by whom, and what to do."""
    if holder is None:
        return (
            f"run {run_id!r} is being written by another process (it has just taken the lock {path}); wait for it "
            "to finish, or choose another --run-id"
        )
    who = f"pid {holder.get('pid')} on host {holder.get('host')} (user {holder.get('user')}"
    who += f", since {holder.get('since')})"
    text = f"run {run_id!r} is being written by {who}: `{holder.get('command')}`. "
    here = holder.get("host") == socket.gethostname()
    renewed, seconds = holder.get("renewed_at"), holder.get("seconds")
    if not here and isinstance(renewed, (int, float)) and isinstance(seconds, (int, float)):
        left = max(0.0, renewed + seconds - datetime.now(timezone.utc).timestamp())
        text += (
            f"Its lease was renewed {max(0.0, seconds - left):.0f} s ago; if that host is gone, the run can be "
            f"resumed here once the lease has gone {seconds:g} s without renewal (in {left:.0f} s). "
        )
    if here and isinstance(holder.get("pid"), int) and not pid_alive(holder["pid"]):
        return text + (
            f"That process is gone, but a process it started still holds {path} open (find it with `fuser -v "
            f"{path}`); stop that process, then run the command again"
        )
    stop = f"stop it (`kill -INT {holder.get('pid')}`{'' if here else ' on that host'})"
    return text + f"Wait for it to finish, or {stop} and then `ragen resume {run_id}`; or choose another --run-id"


def _open_locked(path: Path, run_id: str, wait: bool) -> int:
    """Open ``path`` and take its exclusive lock; raise :class:`RunLockedError` if held (unless ``wait``).

    A holder that releases the lock of a run without a manifest removes the file (and the empty folder); a taker
    that opened the file just before that holds a lock nobody else sees, so it checks that the path still names
    its file and otherwise starts over."""
    import fcntl  # POSIX only: imported here so that the rest of the lake imports everywhere

    for _ in range(LOCK_ATTEMPTS):
        _check_no_link(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # no O_TRUNC: a refused taker writes nothing; no link followed: the holder record truncates the file
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except FileNotFoundError:  # the folder was removed between the two calls
            continue
        except OSError as exc:
            raise LakeError(f"cannot open the lock file {path} of run {run_id!r}: {exc.strerror}") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(descriptor)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLockedError(locked_message(run_id, path, read_holder(path))) from None
            raise LakeError(f"cannot lock {path} of run {run_id!r}: {exc.strerror}") from None
        if _names(path, descriptor):
            return descriptor
        os.close(descriptor)
    raise LakeError(f"cannot lock {path} of run {run_id!r}: other processes keep removing it; try again")


def _check_no_link(path: Path) -> None:
    """The lock file and the folders holding it (``runs/``, ``runs/<id>/``) are no symbolic links, and the lock
    is a regular file when present: taking the lock truncates and writes it, which through a link would clobber a
    file outside the data root."""
    check_real_folders(path.parents[2], path.parent, "run folder")
    check_regular_file(path, "lock file")


def check_not_held(root: Path, run_id: str) -> None:
    """Refuse as :func:`acquire` would, naming the holder, when another process holds the writer lock of ``run_id``;
    create, take and write nothing (for a command's checks before it takes the lock: no file appears for a run that
    has none, and a run's lock file is only opened). Free or absent: return. This process's own hold: return."""
    import fcntl

    path = lock_path(Path(root).resolve(), run_id)
    with _held_guard:
        if path in _held:
            return
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # no link followed, no FIFO waited on
    except (FileNotFoundError, NotADirectoryError):
        return  # no lock file: nobody writes the run (acquire creates it)
    except OSError as exc:
        raise LakeError(f"cannot open the lock file {path} of run {run_id!r}: {exc.strerror}") from None
    try:  # a shared probe conflicts with the holder's exclusive lock (and needs only read access, also over NFS)
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunLockedError(locked_message(run_id, path, read_holder(path))) from None
        raise LakeError(f"cannot lock {path} of run {run_id!r}: {exc.strerror}") from None
    finally:
        os.close(descriptor)  # drops the probe's lock, if it got one
    lease = read_lease(writer_lease_file(path))  # another host's writer, which this host's flock does not see
    if lease is not None and not stale(lease):
        raise RunLockedError(locked_message(run_id, path, lease))


def writer_gone(root: Path, run_id: str) -> bool:
    """Whether no live process, this one included, holds the writer lock of ``run_id`` (every writer holds it while
    it runs): a manifest that still says ``running`` then outlived a writer that died (SIGKILL, a lost machine).
    False when the lock is held or cannot be probed."""
    path = lock_path(Path(root).resolve(), run_id)
    with _held_guard:
        if path in _held:
            return False
    try:
        check_not_held(root, run_id)
    except LakeError:  # held (RunLockedError names the holder), or the lock file cannot be opened
        return False
    return True


def _take(path: Path, run_id: str, holder: dict[str, Any], wait: bool) -> tuple[int, Lease, dict[str, Any] | None]:
    """The flock, then the lease: (the lock file's descriptor, the lease, a stale lease's record). A run folder
    removed meanwhile (its holder released a run without a manifest) starts the take over."""
    for _ in range(LOCK_ATTEMPTS):
        descriptor = _open_locked(path, run_id, wait)  # outside the guard: a waiting taker must not block the others
        try:
            lease, stale_lease = claim(
                writer_lease_file(path),
                holder,
                lambda record: RunLockedError(locked_message(run_id, path, record)),
                wait,
            )
        except FileNotFoundError:
            os.close(descriptor)
            continue
        except BaseException:
            os.close(descriptor)  # the flock goes with it; nothing was written
            raise
        return descriptor, lease, stale_lease
    raise LakeError(f"cannot lock {path} of run {run_id!r}: other processes keep removing it; try again")


def check_writing(root: Path, run_id: str) -> None:
    """Before a commit of ``run_id``: when this process writes the run (holds its lock), refuse
    (:class:`~ragen_core.storage.lease.LeaseLostError`) if its lease was taken over or expired; else nothing."""
    with _held_guard:
        lock = _held.get(lock_path(Path(root).resolve(), run_id))
    if lock is not None and lock.lease is not None:
        lock.lease.check()
    if lock is not None and lock.store_lease is not None:
        lock.store_lease.check()


def lost_writing(root: Path, run_id: str) -> bool:
    """Whether this process held the writer lock of ``run_id`` and lost its lease (another machine writes the run)."""
    with _held_guard:
        lock = _held.get(lock_path(Path(root).resolve(), run_id))
    return lock is not None and lock.lease is not None and lock.lease.lost not in (None, "released")


def _names(path: Path, descriptor: int) -> bool:
    """Whether ``path`` still names the open file ``descriptor``."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(descriptor)
    return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)


def acquire(root: Path, run_id: str, command: list[str] | None = None, wait: bool = False) -> RunLock:
    """Take the writer lock of ``run_id``; ``wait`` blocks until it is free instead of refusing (also while another
    thread of this process holds it). A second take in the process that holds it, without ``wait``, is refused: a
    run has one taker per process (its entry), which hands the open run down. Release with :func:`release`."""
    path = lock_path(Path(root).resolve(), run_id)
    with _held_guard:
        held = _held.get(path)
    if held is not None and not wait:
        raise RunLockedError(
            f"run {run_id!r} is already open for writing in this process (pid {os.getpid()}): a run is opened once, "
            "by its entry, and the open run handed down"
        )
    holder = holder_record(run_id, command)
    descriptor, lease, stale_lease = _take(path, run_id, holder, wait)
    try:
        dead = read_holder(path) or stale_lease  # a record under a free lock: its holder died without releasing it
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(holder, sort_keys=True).encode(), 0)
    except BaseException:
        lease.release()
        os.close(descriptor)
        raise
    copy = store_copy(Path(root))
    store_lease = None
    if copy is not None:  # the bucket's lease object, then the copy's files of the run made the bucket's
        try:
            store_lease, stale_object = copy.take_run(
                holder, lambda record: RunLockedError(locked_message(run_id, path, record)), wait
            )
        except BaseException:
            os.ftruncate(descriptor, 0)  # no record of a holder left under a free lock
            lease.release()
            os.close(descriptor)
            raise
        dead = dead or stale_object
    lock = RunLock(run_id, path, descriptor, holder, taken_over=dead, lease=lease, store_lease=store_lease)
    with _held_guard:
        _held[path] = lock
    return lock


def release(lock: RunLock) -> None:
    """Release ``lock``: its holder record cleared, then unlocked. The lock file of a run that has no manifest (a
    command that stopped before writing anything) is removed, with its folder if empty."""
    import fcntl

    with _held_guard:
        if _held.get(lock.path) is lock:
            _held.pop(lock.path)
        try:
            if lock.store_lease is not None:
                store_copy(lock.path.parent.parent.parent).release_run(lock.run_id)
            if lock.lease is not None:
                lock.lease.release()  # before the flock: a taker here then finds no lease of a live holder
            os.ftruncate(lock.descriptor, 0)  # cleared first: a record under a free lock means a dead holder
            if not manifest_file(lock.path.parent).exists():  # removed while still locked (see _open_locked)
                lock.path.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    lock.path.parent.rmdir()  # only when empty
            fcntl.flock(lock.descriptor, fcntl.LOCK_UN)
        finally:
            os.close(lock.descriptor)


@contextmanager
def run_writer(root: Path, run_id: str, command: list[str] | None = None, wait: bool = False) -> Iterator[RunLock]:
    """Hold the writer lock of ``run_id`` for the ``with`` block (see :func:`acquire`)."""
    lock = acquire(root, run_id, command, wait)
    try:
        yield lock
    finally:
        release(lock)


def takeover_note(lock: RunLock) -> str | None:
    """One line about a stale lock this process took over, or None."""
    stale = lock.taken_over
    if not stale:
        return None
    return (
        f"took over the lock of run {lock.run_id!r} left by pid {stale.get('pid')} on host {stale.get('host')} "
        f"(since {stale.get('since')}), which ended without releasing it"
    )


@contextmanager
def run_lock(lake: DataLake, run_id: str) -> Iterator[None]:
    """Exclusive lock of a run's housekeeping (compaction, removal); fails at once when another process holds it."""
    import fcntl  # POSIX only: imported here so that the rest of the lake imports everywhere

    path = housekeeping_lock_file(lake.root, run_id)
    check_real_folder(path.parent, "locks folder")
    check_regular_file(path, "lock file")  # never opened (or created) through a link
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644), "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise LakeError(f"run {run_id!r} is being compacted or removed by another process; try again") from exc
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
