"""Running one DuckDB statement so that a stop reaches it: the statement runs in a worker thread while the calling
thread waits (a Ctrl-C or SIGTERM then reaches Python's handler at once), a stop or a time limit interrupts it, and
the failures DuckDB makes of a stop are told apart from the others. The query errors and limits of
:func:`ragen_core.storage.catalog.query` are here too."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import duckdb
import pyarrow as pa

from ragen_core import stops
from ragen_core.storage.files import LakeError

INTERRUPT_GRACE = 5.0  # seconds an interrupted query is given to stop before the stop goes on without it


def interrupted(exc: Exception) -> bool:
    """Whether DuckDB failed because a Ctrl-C or SIGTERM landed inside one of its calls. Its handler's
    ``KeyboardInterrupt`` comes back as DuckDB's own error, with no cause attached, so the text is all that says so:
    wrapped (``Invalid Input Error: ... failed: KeyboardInterrupt``) when DuckDB was calling back into Python (binding
    a view over a registered Arrow table, a Python function), or a ``RuntimeError('Query interrupted')`` when it
    checked for signals while running a statement on this thread. Such a failure is the stop, never a read failure
    of the lake."""
    text = str(exc)
    return "KeyboardInterrupt" in text if isinstance(exc, duckdb.Error) else text == "Query interrupted"


def run_interruptible(
    con: duckdb.DuckDBPyConnection, statement: str, params: list | dict | None, timeout: float | None = None
) -> pa.Table:
    """Run the statement in a worker thread while this thread waits, so that a Ctrl-C or SIGTERM reaches Python's
    handler at once (a query holds the calling thread inside DuckDB); the stop interrupts the query
    (``con.interrupt()``) and is raised again once DuckDB has let go, or after ``INTERRUPT_GRACE`` seconds when it
    does not (the worker is a daemon thread: a command that stops does not wait for it). A stop recorded in
    :mod:`ragen_core.stops` counts as one, though its exception never reached this thread (a library swallowed it).
    A query still running after ``timeout`` seconds is stopped the same way, as :class:`QueryTimeout`."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            relation = con.sql(statement, params=params)  # values (run ids...) as parameters, never pasted into SQL
            outcome["table"] = relation.to_arrow_table() if relation is not None else pa.table({})
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
            outcome["error"] = exc

    deadline = None if timeout is None else time.monotonic() + timeout
    worker = threading.Thread(target=work, name="ragen-query", daemon=True)
    try:
        if stops.requested():  # the stop came before, and a library swallowed its exception: no query to start
            raise KeyboardInterrupt
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if stops.requested() and worker.is_alive():  # a stop whose exception did not reach this thread
                raise KeyboardInterrupt
            if deadline is not None and worker.is_alive() and time.monotonic() > deadline:
                raise QueryTimeout(
                    f"the query ran past its time limit of {timeout:g} s and was stopped; give it more time "
                    "(timeout=) or narrow it (a WHERE on run_id or iteration)",
                    "Timeout",
                )
    except BaseException:
        _interrupt(con, worker)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["table"]


def _interrupt(con: duckdb.DuckDBPyConnection, worker: threading.Thread) -> None:
    """Stop the worker's query and give it ``INTERRUPT_GRACE`` seconds to let go. The interrupt is sent again while
    the worker runs: one sent before its query began (a stop in the worker's first instants) is lost on an idle
    connection."""
    give_up = time.monotonic() + INTERRUPT_GRACE
    while True:
        try:
            con.interrupt()
        except duckdb.Error:  # the query is between two calls of the connection: it ends by itself
            pass
        if not worker.is_alive() or time.monotonic() >= give_up:
            return  # a daemon: the process does not wait for a query that ignores the interrupt
        worker.join(0.05)


class QueryError(LakeError):
    """A query DuckDB could not run (a mistake in the SQL, an unknown table or column, memory it may not use), in
    one line; ``kind`` is DuckDB's name for it (``ParserException``, ``CatalogException``, ...)."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


class QueryTimeout(QueryError):
    """A query that ran past its time limit and was stopped."""


MEMORY_SIZE = re.compile(r"^\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)


def check_limits(timeout: float | None, memory_limit: str | None) -> None:
    """Refuse a time limit that is not a positive number of seconds, or a memory limit that is not a size."""
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise QueryError(f"timeout must be a positive number of seconds (or None: no limit), got {timeout!r}")
    if memory_limit is not None and not MEMORY_SIZE.match(str(memory_limit)):
        raise QueryError(f"memory_limit must be a size such as '4GB' or '512MiB' (or None), got {memory_limit!r}")
