"""A long `ragen sql` query stops at once on Ctrl-C (exit 130) and on SIGTERM (exit 143), with one line on stderr
and no traceback: the query runs in a worker thread, so the signal reaches Python's handler, which interrupts it. A
stop that lands while the lake's views are being registered (DuckDB wraps the KeyboardInterrupt into its own error,
which a busy machine made likely) says the same one line."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from ragen_core.storage import DataLake, catalog
from tests.storage.synthetic import make_run, write_run

RAGEN = str(Path(sys.executable).with_name("ragen"))
LONG = "SELECT sum(a.range * b.range) FROM range(100000000) a, range(1000000) b"  # hours of work


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


@pytest.mark.parametrize(
    ("number", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_long_query_stops_at_once(tmp_path, number, code, name):
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    process = subprocess.Popen(
        [RAGEN, "sql", LONG, "--data-root", str(lake.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_the_handlers(process)  # a busy machine can take seconds to start Python: not the case under test
        time.sleep(2)  # the lake opening or the query running: a stop at either point says one line
        assert process.poll() is None, process.communicate()
        sent = time.monotonic()
        process.send_signal(number)
        out, err = process.communicate(timeout=30)
        seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, (out, err)
    assert seconds < 10, f"the query ran on for {seconds:.1f} s after the signal"
    assert err.strip().splitlines() == [f"interrupted ({name})"] and "Traceback" not in out + err


@pytest.mark.parametrize("delay", [0.0, 0.25, 0.5, 1.0, 1.5])
def test_a_stop_at_any_point_of_the_command_says_one_line(tmp_path, delay):
    """SIGTERM from the moment the handlers are in place through opening the lake and starting the query: one line,
    exit 143, whichever step it interrupts (the stress that found the view-registration window sent it at random
    times; these delays cover the same span on a quiet machine)."""
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    process = subprocess.Popen(
        [RAGEN, "sql", LONG, "--data-root", str(lake.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_the_handlers(process)
        time.sleep(delay)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
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
