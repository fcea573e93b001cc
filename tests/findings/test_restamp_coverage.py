"""The re-stamp probe's measurement follows the run's child processes (:func:`coverage_settings`,
:func:`combine_measurements`): a line that only a grandchild runs counts, also when it leaves by ``os._exit``; a line
that only a process killed before it saved would run does not; files outside the measured ones are not recorded."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ragen_core.findings.changes import executed_lines
from ragen_core.findings.restamp_sides import combine_measurements, coverage_settings


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_lines_run_by_child_processes_count_and_a_killed_ones_do_not(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    _write(
        code / "parent.py",
        """\
        import subprocess, sys
        subprocess.run([sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]], check=True)
        subprocess.run([sys.executable, __file__.replace("parent.py", "unmeasured.py")], check=True)
        """,
    )
    _write(
        code / "child.py",  # starts the grandchild, then leaves by os._exit (no exit handler runs)
        """\
        import os, subprocess, sys
        subprocess.run([sys.executable, sys.argv[1]], check=True)
        killed = subprocess.run([sys.executable, sys.argv[2]])
        assert killed.returncode == -9
        os._exit(0)
        """,
    )
    _write(code / "grandchild.py", "first = 1\nsecond = first + 1\n")
    _write(code / "killed.py", "import os, signal\nran = True\nos.kill(os.getpid(), signal.SIGKILL)\n")
    _write(code / "unmeasured.py", "x = 1\n")
    work = tmp_path / "work"
    work.mkdir()
    data = work / "coverage.data"
    measured = [code / n for n in ("parent.py", "child.py", "grandchild.py", "killed.py")]
    settings = coverage_settings(data, measured)
    paths = [str(code / n) for n in ("child.py", "grandchild.py", "killed.py")]
    for _ in range(2):  # two commands of a side, each its own data files
        subprocess.run(
            [sys.executable, "-m", "coverage", "run", f"--rcfile={settings}", str(code / "parent.py"), *paths],
            cwd=tmp_path,
            check=True,
        )
    combine_measurements(data)
    executed = executed_lines(data, code)
    assert executed["parent.py"] == {1, 2, 3}
    assert executed["child.py"] == {1, 2, 3, 4, 5}
    assert executed["grandchild.py"] == {1, 2}
    assert "killed.py" not in executed  # SIGKILLed before it could save: not counted as run
    assert "unmeasured.py" not in executed  # it ran, but is not one of the measured files
    assert sorted(p.name for p in work.iterdir()) == ["coverage.data", "coverage.rc"]  # the children's files added in
