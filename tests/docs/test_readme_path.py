"""The README's "After the demo" gets `ragen` onto the PATH as written (issue 40, section 4 item 1: `ragen: command
not found`): its `source .venv/bin/activate`, run in a fresh shell that knows nothing of the project, makes `ragen`
the venv's own command, and `make demo` ends by saying so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # a fresh shell and make

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)  # the environment `make install` made (the tests run in it)


def _after_the_demo() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## After the demo", 1)[1].split("\n## ", 1)[0]


def test_the_readmes_activation_line_puts_ragen_on_a_fresh_shells_path(tmp_path):
    (command,) = re.findall(r"run `(source [^`]+)` once in your shell", " ".join(_after_the_demo().split()))
    assert command == "source .venv/bin/activate"
    if VENV.name != ".venv":
        pytest.skip(f"the tests run in {VENV}, not a .venv folder as `make install` makes it")
    script = f"{command} && command -v ragen && ragen config show --format csv trainer.keep_last=3"
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        cwd=VENV.parent,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    where, *rows = done.stdout.splitlines()
    assert where == str(VENV / "bin" / "ragen")
    assert any(row.startswith('"trainer.keep_last","3",') for row in rows)  # the command ran, with its argument


def test_make_demo_ends_by_saying_how_to_get_ragen():
    done = subprocess.run(["make", "-n", "demo", "VENV=.venv"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "run 'source .venv/bin/activate' once in your shell to put ragen on your PATH" in done.stdout
