"""A long `ragen sql` query stops at once on Ctrl-C (exit 130) and on SIGTERM (exit 143), with one line on stderr
and no traceback: the query runs in a worker thread, so the signal reaches Python's handler, which interrupts it."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen_core.storage import DataLake
from tests.storage.synthetic import make_run, write_run

RAGEN = str(Path(sys.executable).with_name("ragen"))
LONG = "SELECT sum(a.range * b.range) FROM range(100000000) a, range(1000000) b"  # hours of work


@pytest.mark.parametrize(
    ("number", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_long_query_stops_at_once(tmp_path, number, code, name):
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    process = subprocess.Popen([RAGEN, "sql", LONG, "--data-root", str(lake.root)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        time.sleep(4)  # started, lake opened, the query running
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
