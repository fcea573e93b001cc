"""One entry for a run: how every command that writes a run (train and resume, offline re-training, evaluation)
begins, whoever starts it (the ``ragen`` command, a deployment's flow run on a worker, the Python API: each admits
its request once, :func:`ragen_core.run.procedures.admit`), and a bootstrap model's build, which waits for another
run building it.

The run id is checked by the one checker (:func:`ragen_core.storage.names.validate_run_id`) before anything is read
or created, the data root's :class:`~ragen_core.storage.DataLake` is made once (or the caller's is used) and the
run's writer lock is taken once per process: the command that opened a run hands the open run to the flow it calls,
which takes nothing again (a second :func:`open_run` of a run this process holds is refused). A second process is
refused, naming the holder.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ragen_core.storage import DataLake
from ragen_core.storage.locks import RunLock, acquire, release, takeover_note
from ragen_core.storage.names import validate_run_id
from ragen_core.storage.objectstore import is_store_url
from ragen_core.storage.storecopy import open_store_root


def check_run_id(run_id: str | None, what: str = "run id") -> str | None:
    """``run_id`` (None stays None) when it is a plain name, never a pattern or a path; else
    :class:`~ragen_core.storage.names.InvalidRunIdError` with the rule. For the id a caller gives, checked before
    anything is read or created, and for the default id a command derives."""
    return None if run_id is None else validate_run_id(run_id, what)


def run_lake(data_root: str | Path | DataLake, only: str | None = "write") -> DataLake:
    """The lake of ``data_root``: a folder; a data root in an object store (``s3://bucket/prefix``), as its local
    copy brought up to date with the bucket (``only``: what a writer needs, ``"read"`` what the tables need, None
    everything: :meth:`~ragen_core.storage.storecopy.StoreCopy.pull`), so a deployment's parameters and the Python
    API take the URL as the command line does; or ``data_root`` itself when it already is a lake."""
    if isinstance(data_root, DataLake):
        return data_root
    return DataLake(open_store_root(str(data_root), only) if is_store_url(data_root) else data_root)


@dataclass(frozen=True)
class OpenRun:
    """A run opened for writing: its lake, its (checked) id and this process's hold of its writer lock."""

    lake: DataLake
    run_id: str
    lock: RunLock
    takeover_note: str | None  # a line about a lock a dead holder left, which this entry took over


@contextmanager
def open_run(
    data_root: str | Path | DataLake, run_id: str, command: list[str] | None = None, wait: bool = False
) -> Iterator[OpenRun]:
    """Open ``run_id`` of ``data_root`` for writing for the ``with`` block: its id checked, its lake, its writer lock
    (taken, released at the end; a run this process holds already is refused). ``wait``: block until another
    process's (or thread's) hold ends instead of refusing (a bootstrap run, which another run may be building).
    Raises :class:`~ragen_core.storage.names.InvalidRunIdError` or :class:`~ragen_core.storage.locks.RunLockedError`
    (another live process writes the run: the message names it and says what to do; or this process holds it), both
    :class:`~ragen_core.storage.LakeError`."""
    run_id = validate_run_id(run_id)
    lake = run_lake(data_root)
    lock = acquire(lake.root, run_id, command, wait)
    try:
        yield OpenRun(lake, run_id, lock, takeover_note=takeover_note(lock))
    finally:
        release(lock)
