"""The process's record that it was asked to stop (Ctrl-C, SIGTERM), kept apart from the exception that says so.

The ``ragen`` command's signal handler raises ``KeyboardInterrupt`` where the main thread happens to be, and records
the stop here first. A library can lose that exception: DuckDB and pyarrow check for signals inside their own calls
and turn the handler's exception into an error of theirs, which code that expects read failures may take for one.
The record cannot be lost, so a long wait of the core (a query's) looks at it as well as at the exception: a stop
that arrived before the wait began, or that a library swallowed, still ends it.
"""

from __future__ import annotations

_state = {"stop": False}  # a plain flag: setting it takes no lock, so a signal handler may do it at any point


def request() -> None:
    """Record that the process was asked to stop."""
    _state["stop"] = True


def requested() -> bool:
    """Whether a stop was recorded since the process started (or since :func:`clear`)."""
    return _state["stop"]


def clear() -> None:
    """Forget a recorded stop: for a process that goes on after one (an interactive session, a test)."""
    _state["stop"] = False
