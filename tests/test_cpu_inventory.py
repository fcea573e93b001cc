"""The suite's CPU inventory (``RAGEN_TEST_CPU``): processes are counted in the right row, the table adds up, and the
sampler sees the CPU a marked child spends and leaves an unmarked one out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.cpu_inventory import Sampler, Seen, command, kind, summary

PYTHON = "/venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "row"),
    [
        ([PYTHON, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"], "pytest workers (the tests' own code)"),
        ([PYTHON, "-m", "pytest", "-q", "tests"], "pytest controller (and this count)"),
        ([PYTHON, "/venv/bin/ragen", "train", "--config", "c.yaml"], "ragen commands"),
        ([PYTHON, "-m", "ragen_cli.main", "reproduce", "x"], "ragen commands"),
        ([PYTHON, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app"], "Prefect servers"),
        ([PYTHON, "/venv/lib/site-packages/prefect/engine.py"], "Prefect flow-run processes (deployments)"),
        ([PYTHON, "-m", "prefect", "worker", "start"], "Prefect CLI and workers"),
        ([PYTHON, "-m", "ragen_core.rollout.sampler", "21"], "sampler and learner processes"),
        ([PYTHON, "-m", "ragen_core.training.worker", "--control-file", "f"], "launched update ranks"),
        ([PYTHON, "-m", "coverage", "run", "--append", "launch.py"], "re-stamp probe commands"),
        ([PYTHON, "-c", "print(1)"], "other processes"),
    ],
)
def test_each_process_is_counted_in_its_row(argv, row):
    assert kind(argv) == row


def test_a_ragen_command_is_named_by_its_subcommand():
    assert command([PYTHON, "/venv/bin/ragen", "--verbose", "train", "--config", "c.yaml"]) == "train"
    assert command([PYTHON, "-m", "ragen_cli.main", "resume", "r"]) == "resume"
    assert command([PYTHON, "-c", "print(1)"]) == "?"


def test_the_table_adds_the_rows_and_the_files():
    ragen = [PYTHON, "/venv/bin/ragen"]
    seen = [
        Seen(1, [*ragen, "train"], "tests/a.py::t1 (call)", 6.0),
        Seen(2, [*ragen, "train"], "tests/b.py::t (setup)", 3.0),
        Seen(3, [*ragen, "eval"], "tests/a.py::t2 (call)", 1.0),
        Seen(4, [PYTHON, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"], None, 10.0),
    ]
    lines = summary(seen, wall=10.0, cores=2)
    # 20 s of CPU over 10 s on 2 cores: all of them; the commands 10 s (train 9, eval 1), the workers 10 s
    assert lines[0] == (
        "CPU of the run: 20 s in 4 processes over 10 s on 2 cores (100% of them busy with the run's processes)"
    )
    assert "        10 s  50%     3  ragen commands" in lines
    assert any(line.strip() == "train 9, eval 1" for line in lines)
    assert "        10 s  50%     1  pytest workers (the tests' own code)" in lines
    files = lines[
        lines.index("  counts for the file of the first test that needed it, with every request it then serves):")
        + 1 :
    ]
    assert files == ["         7 s  tests/a.py", "         3 s  tests/b.py"]  # the workers' own CPU is no file's


@pytest.mark.process  # spinning child processes
def test_the_sampler_counts_a_marked_child_and_leaves_an_unmarked_one_out():
    mark = f"inventory-test-{os.getpid()}"
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(1.5)"
    sampler = Sampler(mark, every=0.1).start()
    env = {**os.environ, "RAGEN_TEST_SESSION": mark, "PYTEST_CURRENT_TEST": "tests/x.py::spin (call)"}
    marked = subprocess.Popen([sys.executable, "-c", spin, "marked"], env=env)
    other = subprocess.Popen([sys.executable, "-c", spin, "other"], env={**env, "RAGEN_TEST_SESSION": "another"})
    marked.wait()
    other.wait()
    time.sleep(0.2)
    seen = sampler.stop()
    assert [process.pid for process in seen] == [marked.pid]
    (process,) = seen
    # it spun 0.6 s of CPU after its start-up, then slept while it was sampled: seen in full, but for the kernel's
    # accounting in ticks of 10 ms
    assert 0.55 <= process.cpu < 3.0 and process.argv[-1] == "marked" and process.test == "tests/x.py::spin (call)"
