"""`make test-quick` leaves out the tests that start a `ragen` command; a test that starts one without saying so (a
marker of its own, or one its fixtures give it) is refused where it starts it (tests/conftest.py), so the quick
selection cannot drift back to minutes of commands."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NOT_QUICK, _ragen_command

RAGEN = str(Path(sys.executable).with_name("ragen"))


def test_a_test_without_a_marker_cannot_start_a_ragen_command():
    with pytest.raises(AssertionError, match=r"starts a `ragen` command but carries none of the markers server, "):
        subprocess.Popen([RAGEN, "--help"])
    with pytest.raises(AssertionError, match="mark it `process`"):
        subprocess.run([sys.executable, "-m", "ragen_cli", "--help"], check=False)
    # any other process starts as before
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout == "42\n"


def test_which_processes_are_ragen_commands():
    assert _ragen_command([RAGEN, "train"]) and _ragen_command([Path(RAGEN), "sql"])
    assert _ragen_command([sys.executable, "-m", "ragen_cli", "runs"]) and _ragen_command("ragen sql 'SELECT 1'")
    assert not _ragen_command([sys.executable, "-m", "ragen_core.training.worker", "--join"])
    assert not _ragen_command(["git", "status"]) and not _ragen_command([str(Path(RAGEN).with_name("ragen-x"))])
    assert not _ragen_command([])


def test_the_markers_left_out_are_the_makefiles():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = next(line for line in makefile.splitlines() if line.startswith("QUICK_MARKERS ?="))
    assert line == f"QUICK_MARKERS ?= not ({' or '.join(NOT_QUICK)})"
