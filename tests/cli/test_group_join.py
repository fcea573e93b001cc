"""`ragen group join` refuses what cannot join in one line, before it starts anything (the join itself runs in
tests/flows/test_multinode.py)."""

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["node0", "--nnodes", "2", "--node-rank", "1"], "'node0' is not HOST:PORT"),
        (["node0:29400", "--nnodes", "2", "--node-rank", "0"], "node 0 is the run's own host"),
        (["node0:29400", "--nnodes", "1", "--node-rank", "1"], "at least 2"),
        (["node0:29400", "--nnodes", "2", "--node-rank", "1", "--nproc", "0"], "--nproc must be at least 1"),
    ],
)
def test_a_join_that_cannot_be_is_one_line_and_starts_nothing(args, needle, monkeypatch):
    import ragen_core.training.group as group

    monkeypatch.setattr(group, "run_node", lambda *a: pytest.fail("a refused join started its ranks"))
    result = CliRunner().invoke(app, ["group", "join", *args])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
