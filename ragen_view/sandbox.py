"""The iteration page's queries that hold a user's SQL filter, run in a process of their own with bounded memory and
time, so that no filter can take the viewer's memory or hold it.

DuckDB's ``memory_limit`` bounds a query's operators (joins, sorts, aggregates), not one value a function builds:
``(SELECT length(repeat('x', 3000000000))) > 0`` took a viewer that ran its filters in its own process from 221 MB to
6 GB. Here such a query runs in a child forked from a small server process (this module run as a script: it imports
the lake's reader once, so a child starts in milliseconds), and the child's data segment may grow by
:attr:`Limits.memory_bytes` at most (``RLIMIT_DATA``, which Linux enforces): an allocation beyond it fails inside
DuckDB, which reports an ``OutOfMemoryException``, and the page says so in one line. A child still running past the
time limit ends (``SIGALRM``), whatever DuckDB is doing. Its answer (rows of the data root) is rebuilt here from plain
values only (:func:`plain_values`). The server and its children ignore Ctrl-C and end with the
viewer (the server when its control socket closes, a child at its alarm).
"""

from __future__ import annotations

import importlib
import io
import math
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from ragen_core.storage import LakeError, QueryError, QueryRefused, QueryTimeout

KILL_GRACE_S = 5.0  # past the time limit (when the child's queries stop themselves) the viewer waits this long more
# Filters running at once, each in a child whose memory may grow by Limits.memory_bytes: together they are bounded
# too (8 at once reached 6.3 GB of children on a 24 GB machine). Another waits this long for a place, then is refused.
MAX_RUNNING = 2
PLACE_WAIT_S = 5.0
_PLACES = threading.BoundedSemaphore(MAX_RUNNING)
REBUILT = {cls.__name__: cls for cls in (QueryRefused, QueryTimeout, QueryError, LakeError, ValueError)}
OUT_OF_MEMORY = ("OutOfMemoryException", "MemoryError")
Result = TypeVar("Result")


@dataclass(frozen=True)
class Limits:
    """How long a filter's queries may run (seconds) and how much their process's memory may grow (bytes)."""

    timeout_s: float
    memory_bytes: int

    def time_message(self) -> str:
        return f"out of time (a filter's query may run {self.timeout_s:g} s here): narrow it"

    def memory_message(self) -> str:
        return f"out of memory (a filter's query may use {self.memory_bytes / 1e9:g} GB here): narrow it"


class _Server:
    """The fork server of this process: started on first use, again when it has ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.control: socket.socket | None = None

    def connect(self, preload: str) -> Connection:
        """A connection to a new child of the server (started with ``preload`` imported, when not running)."""
        ours, theirs = socket.socketpair()
        with self.lock, theirs:
            try:
                self._running(preload)
                socket.send_fds(self.control, [b"c"], [theirs.fileno()])
            except OSError:  # the server ended since it was checked: once more, with a new one
                self.process = None
                self._running(preload)
                socket.send_fds(self.control, [b"c"], [theirs.fileno()])
        return Connection(ours.detach())

    def _running(self, preload: str) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        if self.control is not None:
            self.control.close()
        self.control, theirs = socket.socketpair()
        with theirs:
            source = str(Path(__file__).resolve().parents[1])
            paths = [source, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), preload],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
            )


SERVER = _Server()


def run(limits: Limits, call: Callable[..., Result], *args: Any) -> Result:
    """``call(*args)`` (a module-level function and picklable arguments) in a child process within ``limits``: its
    result, or what it raised as the same class here (DuckDB's error classes, :class:`QueryRefused`, ...); running
    past the time limit raises :class:`QueryTimeout`, needing more memory a :class:`QueryError`, each saying so. At
    most :data:`MAX_RUNNING` run at once: a call that finds no place within :data:`PLACE_WAIT_S` is a
    :class:`QueryError` saying so."""
    if not _PLACES.acquire(timeout=PLACE_WAIT_S):
        raise QueryError(
            f"the viewer runs {MAX_RUNNING} filters at once (each may use {limits.memory_bytes / 1e9:g} GB), and "
            "they are all busy: try again when one has ended",
            "Busy",
        )
    try:
        return _run(limits, call, *args)
    finally:
        _PLACES.release()


def _run(limits: Limits, call: Callable[..., Result], *args: Any) -> Result:
    connection = SERVER.connect(call.__module__)
    try:
        connection.send((limits, call, args))
        if not connection.poll(limits.timeout_s + KILL_GRACE_S):
            raise QueryTimeout(limits.time_message(), "Timeout")
        answer = plain_values(connection.recv_bytes())
    except (EOFError, OSError):
        raise QueryError("the filter's query process ended without an answer", "Died") from None
    finally:
        connection.close()
    if answer[0] == "result":
        return answer[1]
    raise _rebuilt(limits, answer[1], answer[2])


# What a child's answer may hold: plain values (the page's rows are lists and dicts of the lake's cells), the page
# itself, and the failure's tuple of strings. Nothing else is rebuilt from its bytes: the rows come from the data
# root, and unpickling may build any class a pickle names.
PLAIN_CLASSES = (
    {("builtins", name) for name in ("list", "dict", "tuple", "set", "frozenset", "bytearray", "complex", "bytes")}
    | {("datetime", name) for name in ("datetime", "date", "time", "timedelta", "timezone")}
    | {
        ("decimal", "Decimal"),
        ("ragen_view.queries", "Page"),
    }
)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in PLAIN_CLASSES:
            raise pickle.UnpicklingError(f"a filter's answer may not hold {module}.{name}")
        return super().find_class(module, name)


def plain_values(data: bytes) -> Any:
    """A child's answer from its pickled bytes, built of :data:`PLAIN_CLASSES` only (any other class it names is
    refused: ``pickle.UnpicklingError``, answered as a query error)."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise QueryError(f"the filter's query process sent what a page cannot hold ({exc})", "Refused") from None


def _rebuilt(limits: Limits, kind: str, message: str) -> Exception:
    """The exception the child raised (its class name and text), as the same class here."""
    if kind in OUT_OF_MEMORY:
        return QueryError(limits.memory_message(), "OutOfMemory")
    if kind == QueryTimeout.__name__:
        return QueryTimeout(limits.time_message(), "Timeout")
    found = getattr(duckdb, kind, None)
    if isinstance(found, type) and issubclass(found, duckdb.Error):
        return found(message)
    if kind in REBUILT:
        return REBUILT[kind](message)
    return QueryError(f"{kind}: {message}", kind)


def _data_size() -> int | None:
    """This process's data segment (Linux's ``VmData``: what ``RLIMIT_DATA`` counts), None where it is not known."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _limit_memory(budget: int) -> None:
    """Let this process's data segment grow by ``budget`` bytes from its size now (Linux; elsewhere the time limit
    alone bounds a filter)."""
    size = _data_size()
    if size is None or not sys.platform.startswith("linux"):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = size + budget if hard == resource.RLIM_INFINITY else min(size + budget, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def _answer(connection: Connection) -> None:
    """A child's work: the request's call within its limits; its result, or its failure's class and text, sent."""
    limits, call, args = connection.recv()
    signal.alarm(math.ceil(limits.timeout_s + KILL_GRACE_S) + 1)  # its default action ends the process
    _limit_memory(limits.memory_bytes)
    try:
        answer: tuple[Any, ...] = ("result", call(*args))
    except Exception as exc:  # noqa: BLE001 - handed to the viewer, which raises it again
        answer = ("error", type(exc).__name__, str(exc))
    try:
        connection.send(answer)
    except Exception as exc:  # noqa: BLE001 - a result that cannot be sent (memory): its failure instead
        connection.send(("error", type(exc).__name__, str(exc)))


def _warm_up() -> None:
    """Load what a process's first lake query loads lazily (DuckDB's Arrow and pandas bindings: half a second) here,
    once, rather than in every child; the connection is closed, its threads joined, before any fork."""
    connection = duckdb.connect(":memory:")
    try:
        connection.register("warm", pa.table({"x": [1]}))
        connection.sql("SELECT x FROM warm").to_arrow_table()
    finally:
        connection.close()


def serve(control: socket.socket) -> None:
    """The fork server: for each socket the viewer sends, a child that answers on it. Ends when the viewer closes
    its end of ``control`` (or exits)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the viewer, which stops this server
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not fds:
            return
        if os.fork() == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _answer(Connection(fds[0]))
            finally:
                os._exit(0)
        os.close(fds[0])


if __name__ == "__main__":
    for module in sys.argv[2:]:
        importlib.import_module(module)  # imported once here, not in every child
    _warm_up()
    serve(socket.socket(fileno=int(sys.argv[1])))
