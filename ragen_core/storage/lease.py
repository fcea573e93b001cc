"""The writer lease: the half of a run's writer lock that holds across hosts (:mod:`ragen_core.storage.locks`).

``flock`` is exact among the processes of one host, and the kernel drops it when its holder dies. Across hosts it
holds only where the shared filesystem carries it (NFSv4 and Linux's NFS client do), and some network and FUSE
filesystems accept it silently as a lock of the one host. So a writer also holds a lease, ``runs/<id>/writer.lease``,
that assumes only what every POSIX-like shared filesystem gives, NFSv3 included: ``link`` of a new name fails when
the name exists (atomically, on the server), ``rename`` moves a name once, and a file written and ``fsync``-ed by one
host is read whole by another that opens it afterwards.

- **Claim.** The record (host, pid, token, when it was renewed, for how long it holds) is written into a file of a
  unique name, then linked to ``writer.lease``: of two claimants only one link succeeds.
- **Renew.** A thread of the holder rewrites the record in place every ``seconds / 6`` (``fsync``-ed); a record not
  renewed for ``seconds`` has expired.
- **Take over.** A lease of this host, once its flock is free (the holder is gone), or another host's that expired,
  is stale: the claimant
  renames it aside under its own token, checks that what it moved is the lease it judged (else it puts the name back),
  and claims afresh. A live lease of another host refuses the run, naming host and process.
- **Fence.** A holder that finds its lease renamed away, or that could not renew it for ``seconds`` (a process
  stopped, a filesystem that hung), has lost it: :meth:`Lease.check`, called before every commit, refuses to commit.

The lease assumes the hosts' clocks agree to within a small part of ``seconds`` (NTP): an expiry is judged by the
claimant's clock against the holder's record. ``RAGEN_LOCK_LEASE_S`` sets ``seconds`` (default 60): a killed
writer's run can be taken over from another host that long after its last renewal (on its own host at once).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_core.storage.files import LakeError

LEASE_ENV = "RAGEN_LOCK_LEASE_S"
DEFAULT_SECONDS = 60.0
RECORD_BYTES = 4096  # a record is padded to this length, so a renewal rewrites it in place without truncating


class LeaseLostError(LakeError):
    """This process's writer lease was taken over or could not be renewed: it must not commit."""


def lease_seconds() -> float:
    """How long a lease holds without renewal (``RAGEN_LOCK_LEASE_S``, default 60 s)."""
    text = os.environ.get(LEASE_ENV)
    try:
        seconds = float(text) if text else DEFAULT_SECONDS
    except ValueError:
        raise LakeError(f"{LEASE_ENV}={text!r} is not a number of seconds; unset it or give e.g. 60") from None
    if not 1.0 <= seconds <= 86400.0:
        raise LakeError(f"{LEASE_ENV}={text!r} is out of range: give 1 to 86400 seconds (default 60)")
    return seconds


def _encoded(record: dict[str, Any]) -> bytes:
    """The record as JSON padded with spaces to :data:`RECORD_BYTES`: every write of it covers the whole file, so a
    reader sees the old record or the new one, never an emptied file (the command is cut to keep it short)."""
    record["command"] = str(record.get("command", ""))[:1000]
    data = json.dumps(record, sort_keys=True).encode()
    if len(data) >= RECORD_BYTES:
        raise LakeError(f"a writer lease record is {len(data)} bytes, over {RECORD_BYTES}: shorten the run's command")
    return data.ljust(RECORD_BYTES)


def read_lease(path: Path) -> dict[str, Any] | None:
    """The record of the lease at ``path``; None when absent or not a record (damaged, planted, half written)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        record = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def stale(record: dict[str, Any], now: float | None = None) -> bool:
    """Whether a lease record no longer holds, for a caller that holds (or has probed free) the run's ``flock`` on
    this host: a lease of this host then outlived its holder (the kernel dropped the holder's flock); another host's
    holds until it goes ``seconds`` without renewal. A record without those fields holds nothing."""
    if record.get("host") == socket.gethostname():
        return True
    renewed, seconds = record.get("renewed_at"), record.get("seconds")
    if not isinstance(renewed, (int, float)) or not isinstance(seconds, (int, float)):
        return True
    return (time.time() if now is None else now) - renewed > seconds


@dataclass
class Lease:
    """A held writer lease (:func:`claim`); renewed by a thread of this process until :meth:`release`."""

    path: Path
    record: dict[str, Any]
    descriptor: int
    seconds: float
    renewed: float = field(default_factory=time.monotonic)  # when a renewal last succeeded (monotonic clock)
    lost: str | None = None
    guard: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._renew_loop, name=f"lease-{self.record['run_id']}", daemon=True).start()

    def _renew_loop(self) -> None:
        while not self.stop.wait(self.seconds / 6):
            with self.guard:
                self._renew()
            if self.lost:
                return

    def _ours(self) -> bool:
        try:
            on_disk = os.stat(self.path)
        except OSError:
            return False
        mine = os.fstat(self.descriptor)
        return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)

    def _renew(self) -> None:
        """Rewrite the record with a new renewal time, unless the lease is no longer ours (then it is lost)."""
        if self.lost:
            return
        if not self._ours():
            taker = read_lease(self.path) or {}
            self.lost = f"taken over by pid {taker.get('pid')} on host {taker.get('host')}"
            return
        if time.monotonic() - self.renewed > self.seconds:  # expired here: another host may be taking it now
            self.lost = f"not renewed for more than {self.seconds:g} s (this process was stopped or the disk hung)"
            return
        self.record["renewed_at"] = time.time()
        data = _encoded(self.record)
        try:
            os.pwrite(self.descriptor, data, 0)  # the whole padded record: never a moment without one
            os.fsync(self.descriptor)
        except OSError as exc:  # tried again at the next turn, until the lease expires here
            del exc
            return
        self.renewed = time.monotonic()

    def check(self) -> None:
        """Refuse (:class:`LeaseLostError`) when the lease is lost; renew it first when half its time has passed
        since the last renewal (a commit after a long stage)."""
        with self.guard:
            if not self.lost and time.monotonic() - self.renewed > self.seconds / 2:
                self._renew()
            if self.lost:
                run = self.record["run_id"]
                raise LeaseLostError(
                    f"this process no longer holds the writer lease of run {run!r} ({self.lost}): it stops without "
                    f"committing; the new holder writes the run (`ragen resume {run}` once it ends)"
                )

    def release(self) -> None:
        """Stop renewing; remove the lease when it is still ours."""
        self.stop.set()
        with self.guard:
            try:
                if not self.lost and self._ours():
                    self.path.unlink(missing_ok=True)
            finally:
                os.close(self.descriptor)


def claim(
    path: Path, holder: dict[str, Any], refuse: Callable[[dict[str, Any]], Exception]
) -> tuple[Lease, dict[str, Any] | None]:
    """Take the lease at ``path`` for ``holder`` (its record: run_id, pid, host, ...): (the lease, renewing, and the
    record of a stale lease taken over, or None). A live lease raises ``refuse(its record)``. The caller holds the
    run's flock on this host (:func:`stale`)."""
    seconds = lease_seconds()
    taken_over = None
    for _ in range(20):
        record = {**holder, "token": uuid.uuid4().hex, "renewed_at": time.time(), "seconds": seconds}
        descriptor = _link_new(path, record)
        if descriptor is not None:
            lease = Lease(path, record, descriptor, seconds)
            lease.start()
            return lease, taken_over
        current = read_lease(path)
        if current is None:
            if _young(path, seconds):  # being written, or just released: look again
                time.sleep(0.05)
                continue
            current = {}  # a file that is no record, older than a lease: nothing holds it
        if not stale(current):
            raise refuse(current)
        if _set_aside(path, current, record["token"], refuse):
            taken_over = current or taken_over
    raise LakeError(f"cannot take the writer lease {path}: other processes keep changing it; try again")


def _link_new(path: Path, record: dict[str, Any]) -> int | None:
    """Write ``record`` into a file of a unique name and link it to ``path``: its open descriptor, or None when
    ``path`` exists (another claimant's link won)."""
    fresh = path.with_name(f"{path.name}.{record['token']}")
    descriptor = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(descriptor, _encoded(record))
        os.fsync(descriptor)
        try:
            os.link(fresh, path)
        except FileExistsError:
            os.close(descriptor)
            return None
        except OSError:
            if os.fstat(descriptor).st_nlink != 2:  # NFS may report a link that was made as failed: look
                raise
        return descriptor
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(descriptor)
        raise
    finally:
        fresh.unlink(missing_ok=True)


def _young(path: Path, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < seconds
    except FileNotFoundError:
        return True


def _set_aside(path: Path, judged: dict[str, Any], token: str, refuse: Callable[[dict[str, Any]], Exception]) -> bool:
    """Move the stale lease ``judged`` out of the way under this claimant's ``token``. True when moved; False when
    it was already gone. Moving another lease than the one judged (a faster claimant's, fresh) puts it back and
    refuses."""
    aside = path.with_name(f"{path.name}.stale-{token}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    moved = read_lease(aside) or {}
    if moved.get("token") == judged.get("token"):
        aside.unlink(missing_ok=True)
        return True
    with contextlib.suppress(FileExistsError):
        os.link(aside, path)  # back, unless yet another claimant linked one meanwhile
    aside.unlink(missing_ok=True)
    raise refuse(moved)
