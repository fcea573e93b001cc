"""A long `ragen sql` query stops at once on Ctrl-C (exit 130) and on SIGTERM (exit 143), with one line on stderr
and no traceback: the query runs in a worker thread, so the signal reaches Python's handler, which interrupts it. A
stop that lands while the lake's views are being registered (DuckDB wraps the KeyboardInterrupt into its own error,
which a busy machine made likely) says the same one line."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from ragen_core import stops
from ragen_core.storage import DataLake, catalog, running
from tests.storage.synthetic import make_run, write_run

RAGEN = str(Path(sys.executable).with_name("ragen"))
LONG = "SELECT sum(a.range * b.range) FROM range(100000000) a, range(1000000) b"  # hours of work


def _start(lake: DataLake) -> subprocess.Popen:
    """``ragen sql LONG`` in a session of its own, with Python's fault handler on: :func:`_stopped` has it print
    every thread's stack when the command does not stop."""
    return subprocess.Popen(
        [RAGEN, "sql", LONG, "--data-root", str(lake.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )


def _stopped(process: subprocess.Popen, timeout: float = 30) -> tuple[str, str]:
    """The command's output once it ended by itself within ``timeout`` seconds of the stop; otherwise a failure that
    shows where each of its threads was (SIGABRT makes the fault handler print them)."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            out, err = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        stacks = f"{err}\n{out}"
        raise AssertionError(f"the command ran on for {timeout:g} s after the stop; its stacks:\n{stacks}") from None


def _wait_for_the_handlers(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the command catches SIGTERM (its handlers are installed: bit 15 of ``SigCgt`` in /proc): before that, a
    signal meets Python's defaults, which say nothing of ours."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        status = Path(f"/proc/{process.pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.05)
    raise AssertionError("the command did not install its signal handlers in time")


@pytest.mark.process  # a ragen sql process, signalled
@pytest.mark.parametrize(
    ("number", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_long_query_stops_at_once(tmp_path, number, code, name):
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    process = _start(lake)
    try:
        _wait_for_the_handlers(process)  # a busy machine can take seconds to start Python: not the case under test
        time.sleep(2)  # the lake opening or the query running: a stop at either point says one line
        assert process.poll() is None, process.communicate()
        sent = time.monotonic()
        process.send_signal(number)
        out, err = _stopped(process)
        seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, (out, err)
    assert seconds < 10, f"the query ran on for {seconds:.1f} s after the signal"
    assert err.strip().splitlines() == [f"interrupted ({name})"] and "Traceback" not in out + err


@pytest.mark.process  # a ragen sql process, signalled
@pytest.mark.parametrize("delay", [0.0, 0.25, 0.5, 1.0, 1.5])
def test_a_stop_at_any_point_of_the_command_says_one_line(tmp_path, delay):
    """SIGTERM from the moment the handlers are in place through opening the lake and starting the query: one line,
    exit 143, whichever step it interrupts (the stress that found the view-registration window sent it at random
    times; these delays cover the same span on a quiet machine)."""
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    process = _start(lake)
    try:
        _wait_for_the_handlers(process)
        time.sleep(delay)
        process.send_signal(signal.SIGTERM)
        out, err = _stopped(process)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, (out, err)
    assert err.strip().splitlines() == ["interrupted (SIGTERM)"] and "Traceback" not in out + err


class _StopWhileBinding:
    """A real DuckDB connection on which binding ``table``'s view over its Parquet files meets a stop: the statement
    is preceded by a Python function that raises ``KeyboardInterrupt``, as a Ctrl-C's handler does when it runs inside
    one of DuckDB's calls back into Python, so what comes back is DuckDB's own wrapping of it (``Invalid Input
    Error: ... KeyboardInterrupt``)."""

    def __init__(self, con, table: str) -> None:
        self.con, self.table = con, table

        def stop() -> int:
            raise KeyboardInterrupt

        con.create_function("ragen_test_stop", stop, [], "BIGINT")

    def execute(self, statement, *args, **kwargs):
        if statement.startswith(f"CREATE VIEW {self.table} AS") and "read_parquet" in statement:
            self.con.execute("SELECT ragen_test_stop()").fetchall()
        return self.con.execute(statement, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.con, name)


@pytest.mark.parametrize("table", ["trajectories", "metrics"])
def test_a_stop_wrapped_by_duckdb_while_a_view_is_bound_stops_the_query(tmp_path, monkeypatch, table):
    """The window the SIGTERM test above found on a busy machine, made certain: a stop that DuckDB wraps into its
    own error while the lake's views are bound is the stop, raised as ``KeyboardInterrupt``. It was taken for a read
    failure (the table's view made a failing one) and the command went on to run its query for hours, deaf to the
    signal it had already caught."""
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    statement = f"SELECT count(*) > 0 AS read FROM {table}"  # a query of the table: its view is bound
    assert catalog.query(lake, statement).to_pylist() == [{"read": True}]  # the lake reads as it is
    connect = duckdb.connect
    monkeypatch.setattr(duckdb, "connect", lambda *a, **k: _StopWhileBinding(connect(*a, **k), table))
    with pytest.raises(KeyboardInterrupt) as stopped:
        catalog.query(lake, statement)
    assert isinstance(stopped.value.__cause__, duckdb.Error) and "KeyboardInterrupt" in str(stopped.value.__cause__)


def _long_query(lake: DataLake, result: dict) -> None:
    """:data:`LONG` through :func:`catalog.query` with a 60 s limit (a stop that is not seen fails as a timeout, not
    as a hang); what it raised, and when, into ``result``."""
    try:
        catalog.query(lake, LONG, timeout=60)
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        result["raised"], result["at"] = exc, time.monotonic()


@pytest.fixture
def lake(tmp_path):
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    yield lake
    stops.clear()


def test_a_stop_recorded_before_the_query_keeps_it_from_starting(lake):
    """A stop whose ``KeyboardInterrupt`` a library swallowed on the way (its handler recorded it first) still stops
    the command's query: it never starts."""
    stops.request()
    result: dict = {}
    started = time.monotonic()
    _long_query(lake, result)
    assert isinstance(result["raised"], KeyboardInterrupt), result
    assert result["at"] - started < 10


def test_a_stop_recorded_while_the_query_runs_ends_it(lake):
    """A stop recorded while the query runs, with no exception reaching the waiting thread (as when a library
    swallowed it), interrupts the query: it ends within the grace DuckDB is given, as ``KeyboardInterrupt``."""
    result: dict = {}
    waiting = threading.Thread(target=_long_query, args=(lake, result))
    waiting.start()
    time.sleep(1.0)
    assert waiting.is_alive()  # the query runs
    sent = time.monotonic()
    stops.request()
    waiting.join(30)
    assert not waiting.is_alive() and isinstance(result["raised"], KeyboardInterrupt), result
    assert result["at"] - sent < running.INTERRUPT_GRACE + 2


class _StopWhileLocking:
    """A real DuckDB connection on which locking the connection (the last statement that makes the views) fails
    with ``error``."""

    def __init__(self, con, error: BaseException) -> None:
        self.con, self.error = con, error

    def execute(self, statement, *args, **kwargs):
        if statement.startswith("SET lock_configuration"):
            raise self.error
        return self.con.execute(statement, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_stop_duckdb_turned_into_its_runtime_error_while_the_views_are_made_is_the_stop(lake, monkeypatch):
    """When a signal's handler raises ``KeyboardInterrupt`` while DuckDB runs a statement of the calling thread (one
    that makes the views or locks the connection), DuckDB 2.0 raises ``RuntimeError('Query interrupted')`` in its
    place (seen with a real SIGTERM; at other times it swallows the exception and goes on, which the two tests above
    cover). That error is the stop, raised as ``KeyboardInterrupt``; any other ``RuntimeError`` is left as it is."""
    connect = duckdb.connect
    cases = ((RuntimeError("Query interrupted"), KeyboardInterrupt), (RuntimeError("other"), RuntimeError))
    for error, raised in cases:
        monkeypatch.setattr(duckdb, "connect", lambda *a, e=error, **k: _StopWhileLocking(connect(*a, **k), e))
        with pytest.raises(raised) as stopped:
            catalog.query(lake, "SELECT count(*) FROM metrics")
        assert stopped.value is error or stopped.value.__cause__ is error
    monkeypatch.undo()
    assert catalog.query(lake, "SELECT count(*) > 0 AS read FROM metrics").to_pylist() == [{"read": True}]
