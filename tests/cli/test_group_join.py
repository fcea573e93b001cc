"""`ragen group join` refuses what cannot join in one line, before it starts anything (the join itself runs in
tests/flows/test_launcher.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["node0", "--nnodes", "2", "--node-rank", "1", "--nproc", "1"], "'node0' is not HOST:PORT"),
        (["node0:29400", "--nnodes", "2", "--node-rank", "0", "--nproc", "1"], "node 0 is the run's own host"),
        (["node0:29400", "--nnodes", "1", "--node-rank", "1", "--nproc", "1"], "at least 2"),
        (["node0:29400", "--nnodes", "2", "--node-rank", "1", "--nproc", "0"], "--nproc must be at least 1"),
    ],
)
def test_a_join_that_cannot_be_is_one_line_and_starts_nothing(args, needle, monkeypatch):
    import ragen_core.training.nodes as nodes

    monkeypatch.setattr(nodes, "run_node", lambda *a: pytest.fail("a refused join started its ranks"))
    result = CliRunner().invoke(app, ["group", "join", *args])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


@pytest.mark.process  # the `ragen` command line
def test_the_ranks_per_node_are_never_assumed():
    """--nproc has no default: a node that joined with another count than the run's trainer.nproc would shift every
    rank (the ranks refuse such a group), so the command asks for it; the real command line's one line."""
    script = Path(sys.executable).with_name("ragen")
    done = subprocess.run(
        [str(script), "group", "join", "node0:29400", "--nnodes", "2", "--node-rank", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ragen group join: Missing option '--nproc'"), done.stderr
