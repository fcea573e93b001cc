"""The writer lease: the half of a run's writer lock that holds across hosts (:mod:`ragen_core.storage.locks`).

``flock`` is exact among the processes of one host, and the kernel drops it when its holder dies. Across hosts it
holds only where the shared filesystem carries it (NFSv4 and Linux's NFS client do), and some network and FUSE
filesystems accept it silently as a lock of the one host. So a writer also holds a lease, ``runs/<id>/writer.lease``,
that assumes only what every POSIX-like shared filesystem gives, NFSv3 included: ``link`` of a new name fails when
the name exists (atomically, on the server), ``rename`` moves a name once, and a file written and ``fsync``-ed by one
host is read whole by another that opens it afterwards.

- **Claim.** The record (host, pid, token, when it was renewed, for how long it holds) is written into a file of a
  unique name, then linked to ``writer.lease``: of two claimants only one link succeeds.
- **Renew.** A thread of the holder rewrites the record in place every ``seconds / 6`` (``fsync``-ed), each time
  with a new token; a claimant takes a record not renewed for ``seconds`` as expired.
- **Take over.** A lease of this machine (the same kernel: its boot id, else its host name), once its flock is free
  (the holder is gone), or another machine's that expired, is stale: the claimant renames it aside under its own
  token and checks that what it moved still holds the token it judged (a holder that renewed meanwhile wrote a new
  one: the claimant puts it back), then claims afresh. A live lease of another machine refuses the run, naming host
  and process (a waiting taker waits for it instead).
- **Fence.** Before every write of the run's lake the holder reads its lease back (:meth:`Lease.check`): a lease no
  longer holding its token was taken over, and the holder is refused the write; its run's end is not recorded
  either (the new holder writes the run). A holder that was only stopped for a while (Ctrl-Z, then ``fg``) and
  finds its lease still there renews it and goes on.

The lease assumes the hosts' clocks agree to within a small part of ``seconds`` (NTP): an expiry is judged by the
claimant's clock against the holder's record. ``RAGEN_LOCK_LEASE_S`` sets ``seconds`` (default 60): a killed
writer's run can be taken over from another machine that long after its last renewal (on its own at once).
"""

from __future__ import annotations

import contextlib
import errno
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
COMMAND_CHARS = 400  # the holder's command as the record keeps it (escaped, at most 6 bytes a character)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class LeaseLostError(LakeError):
    """This process's writer lease was taken over or could not be renewed: it must not write the run."""


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


def machine() -> str:
    """This machine as a lease names it: the kernel's boot id (processes that share a kernel share its flocks, also
    in containers of different host names), else the host name."""
    try:
        return BOOT_ID.read_text().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()


def _encoded(record: dict[str, Any]) -> bytes:
    """The record as JSON padded with spaces to :data:`RECORD_BYTES`: every write of it covers the whole file, so a
    reader sees the old record or the new one, never an emptied file (the command is cut to keep it short)."""
    record["command"] = str(record.get("command", ""))[:COMMAND_CHARS]
    data = json.dumps(record, sort_keys=True).encode()
    if len(data) >= RECORD_BYTES:
        raise LakeError(f"a writer lease record is {len(data)} bytes, over {RECORD_BYTES}: shorten the host's name")
    return data.ljust(RECORD_BYTES)


def read_lease(path: Path) -> dict[str, Any] | None:
    """The record of the lease at ``path``; None when absent or not a record (damaged, planted, half written, a link
    or a FIFO in its place: never followed, never waited on)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.read(descriptor, RECORD_BYTES)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    try:
        record = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def pid_alive(pid: object) -> bool:
    """Whether this machine (its pid namespace) has a process numbered ``pid``, someone else's too; a value that is
    no process number (a record planted or damaged: not an int, 0, negative, out of range) names none."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def stale(record: dict[str, Any], now: float | None = None) -> bool:
    """Whether a lease record no longer holds, for a caller that holds (or has probed free) the run's ``flock`` on
    this machine: a lease of this machine then outlived its holder (the kernel dropped the holder's flock); another
    machine's holds until it goes ``seconds`` without renewal. A record without those fields holds nothing."""
    if record.get("machine", record.get("host")) == machine():
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
    confirmed: float = field(default_factory=time.monotonic)  # when the last renewal began that succeeded
    lost: str | None = None
    guard: Any = field(default_factory=threading.Lock)  # threading.Lock (a factory, not a type pydantic knows)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._renew_loop, name=f"lease-{self.record['run_id']}", daemon=True).start()

    def _renew_loop(self) -> None:
        while not self.stop.wait(self.seconds / 6):
            with self.guard:
                self._renew()
                if self.lost:
                    return

    def _taken(self) -> str | None:
        """None while ``writer.lease`` holds this lease's token (read back, not from a cached stat); else why not.
        An absent or unreadable file is looked at again a moment later: a claimant may be putting it back."""
        for _ in range(2):
            current = read_lease(self.path)
            if current is not None and current.get("token") == self.record["token"]:
                return None
            if current is not None:
                return f"taken over by pid {current.get('pid')} on host {current.get('host')}"
            time.sleep(0.2)
        return "its file was removed"

    def _renew(self) -> None:
        """Under :attr:`guard`: rewrite the record with a new token and renewal time, unless the lease was taken over
        (then it is lost). A claimant that judged the old record moves a lease whose token it no longer finds back."""
        if self.lost:
            return
        self.lost = self._taken()
        if self.lost:
            return
        started = time.monotonic()
        self.record.update(token=uuid.uuid4().hex, renewed_at=time.time())
        try:
            os.pwrite(self.descriptor, _encoded(self.record), 0)  # the whole padded record: never without one
            os.fsync(self.descriptor)
        except OSError as exc:
            if exc.errno in (errno.ESTALE, errno.ENOENT):  # the file was removed on the server
                self.lost = "its file was removed"
            return  # else tried again at the next turn
        self.confirmed = started

    def check(self) -> None:
        """Refuse (:class:`LeaseLostError`) when the lease was taken over; else (renewing it when a renewal is due)
        go on: a lease taken over is seen at the holder's next write."""
        with self.guard:
            if not self.lost:
                if time.monotonic() - self.confirmed > self.seconds / 6:
                    self._renew()
                else:
                    self.lost = self._taken()
            if self.lost:
                run = self.record["run_id"]
                raise LeaseLostError(
                    f"this process no longer holds the writer lease of run {run!r} ({self.lost}): it stops without "
                    f"writing; the new holder writes the run (`ragen resume {run}` once it ends)"
                )

    def release(self) -> None:
        """Stop renewing; remove the lease when it is still this one: moved aside first and its token checked, so that
        a lease another machine claimed meanwhile is put back, never deleted."""
        self.stop.set()
        with self.guard:
            try:
                if not self.lost:
                    aside = self.path.with_name(f"{self.path.name}.stale-{self.record['token']}")
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(self.path, aside)
                        if (read_lease(aside) or {}).get("token") != self.record["token"]:
                            with contextlib.suppress(FileExistsError):
                                os.link(aside, self.path)  # another's: back where it was
                        aside.unlink(missing_ok=True)
            finally:
                self.lost = self.lost or "released"  # the renewal thread stops before touching the descriptor
                os.close(self.descriptor)


def claim(
    path: Path, holder: dict[str, Any], refuse: Callable[[dict[str, Any]], Exception], wait: bool = False
) -> tuple[Lease, dict[str, Any] | None]:
    """Take the lease at ``path`` for ``holder`` (its record: run_id, pid, host, ...): (the lease, renewing, and the
    record of a stale lease taken over, or None). A live lease raises ``refuse(its record)``, or with ``wait`` is
    waited for (until released or expired). The caller holds the run's flock on this machine (:func:`stale`)."""
    seconds = lease_seconds()
    taken_over, attempts = None, 0
    while True:
        record = {**holder, "machine": machine(), "token": uuid.uuid4().hex, "renewed_at": time.time()}
        record["seconds"] = seconds
        descriptor = _link_new(path, record)
        if descriptor is not None:
            lease = Lease(path, record, descriptor, seconds)
            lease.start()
            _remove_leftovers(path, seconds)
            return lease, taken_over
        attempts += 1
        current = read_lease(path)
        if current is None:
            if _young(path, seconds) and attempts < 100:  # being written, or just released: look again
                time.sleep(0.05)
                continue
            current = {}  # a file that is no record, older than a lease: nothing holds it
        if not stale(current):
            if not wait:
                raise refuse(current)
            time.sleep(min(2.0, seconds / 6))
            continue
        try:
            if _set_aside(path, current, record["token"], refuse):
                taken_over = current or taken_over
        except LakeError:  # it moved a live lease (a faster claimant's) and put it back
            if not wait:
                raise
        if attempts > 200:
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
        return time.time() - os.lstat(path).st_mtime < seconds
    except FileNotFoundError:
        return True


def _remove_leftovers(path: Path, seconds: float) -> None:
    """Files a killed claimant left beside the lease (``writer.lease.<token>``, ``writer.lease.stale-<token>``),
    once older than a lease: nobody uses them any more."""
    for leftover in path.parent.glob(f"{path.name}.*"):
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(leftover).st_mtime > seconds:
                leftover.unlink()


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
