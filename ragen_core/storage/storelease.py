"""The writer lease of a run whose data root is in an object store: an object, ``runs/<id>/store.lease`` in the
bucket, holding its owner's record (host, machine, pid, command, token, when renewed, for how long).

An object store has no ``link`` and no ``rename``, but it has conditional puts, and they are enough:

- **Claim.** The record is put with ``If-None-Match: *``: of two claimants only one put creates the object.
- **Renew.** A thread of the holder puts a fresh record every ``seconds / 6`` with ``If-Match: <the tag it holds>``:
  the put fails exactly when someone else replaced the object, and then the lease is lost.
- **Take over.** A record not renewed for ``seconds`` (or one of this machine whose process is gone) is stale; the
  claimant replaces it with ``If-Match: <the stale record's tag>``, so of several takers one wins, and a holder that
  renewed meanwhile keeps its lease (its renewal changed the tag).
- **Fence.** Before a commit the holder reads the object back (:meth:`StoreLease.check`): another tag means it was
  taken over and the holder writes nothing more. The commit itself is a create-only put as well
  (:mod:`ragen_core.storage.storecopy`), so even a holder stopped between that check and its commit cannot commit an
  iteration another writer committed.

Expiry is judged by the claimant's clock against the holder's record, as for the lease on a shared filesystem
(:mod:`ragen_core.storage.lease`, whose ``RAGEN_LOCK_LEASE_S`` sets ``seconds`` here too): the hosts' clocks must
agree to within a small part of it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ragen_core.storage.files import LakeError
from ragen_core.storage.lease import LeaseLostError, lease_seconds, machine, pid_alive
from ragen_core.storage.objectstore import Store, StoreError
from ragen_core.storage.storenames import as_json, finite

UNKNOWN = "unknown"


def lease_key(run_id: str) -> str:
    """The lake path of a run's lease object in the bucket (the lease file's place on a local root)."""
    from ragen_core.storage.layout import RUNS, STORE_LEASE

    return f"{RUNS}/{run_id}/{STORE_LEASE}"


def store_machine() -> str:
    """This machine as a lease object names it: the kernel (its boot id, :func:`ragen_core.storage.lease.machine`)
    and the pid namespace, whose processes this one can see (containers on one kernel each have their own)."""
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = UNKNOWN  # then no record is judged by its process: only by its time
    return f"{machine()}/pid:{namespace}"


def writer_gone(record: dict[str, Any]) -> bool:
    """Whether the process a record names (``machine``, ``pid``) is known to be gone: judged only on its own
    machine."""
    here = store_machine()
    return record.get("machine") == here and not here.endswith(UNKNOWN) and not pid_alive(record.get("pid"))


def store_stale(record: dict[str, Any], now: float | None = None) -> bool:
    """Whether a lease object's record no longer holds: its process is gone (judged only on its own machine), or
    it went ``seconds`` without renewal; a record without those fields holds nothing."""
    if writer_gone(record):
        return True
    renewed, seconds = record.get("renewed_at"), record.get("seconds")
    if not finite(renewed) or not finite(seconds):
        return True
    return (time.time() if now is None else now) - renewed > seconds


class StoreLease:
    """A held lease object (:func:`claim_store_lease`); renewed by a thread of this process until :meth:`release`."""

    def __init__(self, store: Store, record: dict[str, Any], etag: str, seconds: float) -> None:
        self.store, self.record, self.etag, self.seconds = store, record, etag, seconds
        self.key = lease_key(record["run_id"])
        self.confirmed = time.monotonic()
        self.lost: str | None = None
        self.tried: list[str] = []  # tokens of renewals whose answer did not come
        self.guard = threading.Lock()
        self.stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._renew_loop, name=f"store-lease-{self.record['run_id']}", daemon=True).start()

    def _renew_loop(self) -> None:
        while not self.stop.wait(self.seconds / 6):
            with self.guard:
                self._renew()
                if self.lost:
                    return

    def _taken(self) -> str:
        current = self.store.read(self.key)
        if current is None:
            return "its object was removed"
        record = as_json(current[0])
        return f"taken over by pid {record.get('pid')} on host {record.get('host')}"

    def _renew(self) -> None:
        """Under :attr:`guard`: put a new record while the object still holds this lease's tag; a failed condition
        loses the lease, a store that cannot be reached is tried again at the next turn (and loses it once the
        lease has gone ``seconds`` unrenewed)."""
        if self.lost:
            return
        started = time.monotonic()
        record = {**self.record, "token": uuid.uuid4().hex, "renewed_at": time.time()}
        self.tried.append(record["token"])
        try:
            etag = self.store.replace(self.key, json.dumps(record, sort_keys=True).encode(), self.etag)
        except StoreError as exc:
            if time.monotonic() - self.confirmed > self.seconds:
                self.lost = f"it could not be renewed for {self.seconds:g} s ({exc})"
            return
        if etag is None:
            current = self.store.read(self.key)  # a renewal that landed while its answer was lost is still ours
            mine = current is not None and as_json(current[0]).get("token") in self.tried
            if not mine:
                self.lost = self._taken()
                return
            record, etag = as_json(current[0]), current[1]
        self.record, self.etag, self.confirmed, self.tried = record, etag, started, []

    def check(self) -> None:
        """Refuse (:class:`LeaseLostError`) when the lease object no longer holds this lease's tag; else go on."""
        with self.guard:
            if not self.lost:
                current = self.store.read(self.key)
                if current is None or current[1] != self.etag:
                    self.lost = self._taken() if current is not None else "its object was removed"
            if self.lost:
                run = self.record["run_id"]
                raise LeaseLostError(
                    f"this process no longer holds the writer lease of run {run!r} in {self.store.root.url} "
                    f"({self.lost}): it stops without writing; the new holder writes the run"
                )

    def release(self) -> None:
        """Stop renewing; delete the object only while it holds this lease's tag (another's is never deleted)."""
        self.stop.set()
        with self.guard:
            try:
                if not self.lost:
                    self.store.remove(self.key, self.etag)
            except StoreError:
                pass  # the lease then expires on its own
            finally:
                self.lost = self.lost or "released"


def claim_store_lease(
    store: Store, holder: dict[str, Any], refuse: Callable[[dict[str, Any]], Exception], wait: bool = False
) -> tuple[StoreLease, dict[str, Any] | None]:
    """Take the lease object of ``holder['run_id']``: (the lease, renewing, and the record of a stale lease taken
    over, or None). A live lease raises ``refuse(its record)``, or with ``wait`` is waited for."""
    seconds = lease_seconds()
    key = lease_key(holder["run_id"])
    taken_over, races = None, 0
    while races < 1000:  # a failed create or take-over (another claimant's won): look again
        record = {**holder, "machine": store_machine(), "token": uuid.uuid4().hex, "renewed_at": time.time()}
        record["seconds"] = seconds
        data = json.dumps(record, sort_keys=True).encode()
        current = store.read(key)
        if current is None:
            etag = store.create(key, data)
        else:
            judged = as_json(current[0])
            if not store_stale(judged):
                if not wait:
                    raise refuse(judged)
                time.sleep(min(2.0, seconds / 6))
                continue
            etag = store.replace(key, data, current[1])
            taken_over = judged if etag is not None else taken_over
        if etag is not None:
            lease = StoreLease(store, record, etag, seconds)
            lease.start()
            return lease, taken_over
        races += 1
    raise LakeError(f"cannot take the writer lease {key} in {store.root.url}: it keeps changing; try again")
