"""`ragen group join` refuses what cannot join in one line, before it starts anything (the join itself runs in
tests/flows/test_launcher.py)."""

import os
import signal
import subprocess
import sys
import time
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


def _launchers(port: int) -> list[int]:
    """Pids of torchrun launchers of this machine aimed at ``port``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torch.distributed.run" in command and str(port).encode() in command:
            found.append(int(entry.name))
    return found


@pytest.mark.process  # the `ragen` command line and its torchrun
def test_a_join_stopped_while_it_waits_for_the_group_leaves_nothing_behind(tmp_path):
    """SIGTERM (a scheduler's stop) while the node waits at the rendezvous, where torchrun runs no signal handler for
    ten minutes: the command passes it on, ends its launcher within the grace, says so in one line and exits 143."""
    from ragen_core.training.distributed import free_port
    from ragen_core.training.nodes import STOP_GRACE_S

    port = free_port()  # nobody listens: node 0 never comes
    script = Path(sys.executable).with_name("ragen")
    command = [str(script), "group", "join", f"127.0.0.1:{port}", "--nnodes", "2", "--node-rank", "1", "--nproc", "1"]
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(command, cwd=tmp_path, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _launchers(port) and time.monotonic() < deadline:  # the launcher is at the rendezvous
            time.sleep(0.2)
        assert _launchers(port), out.read_text() + err.read_text()
        time.sleep(2.0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_GRACE_S + 20) == 143
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = err.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: node 1 left the update group (its log: "), lines
    assert Path(lines[0].split("its log: ", 1)[1].rstrip(")")).is_file()
    assert _launchers(port) == []
