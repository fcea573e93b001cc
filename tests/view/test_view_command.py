"""`ragen view` as a command: a user's mistake is one line on stderr before anything listens, and Ctrl-C stops it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

from tests.view.conftest import REPO, start_viewer


def _view(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ragen_cli.main", "view", "--no-open", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_mistakes_are_one_line_before_anything_listens(tmp_path):
    missing = _view("--data-root", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "nowhere").exists(), "a read-only command creates no data root"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = _view("--data-root", str(tmp_path), "--port", str(taken.getsockname()[1]))
    assert busy.returncode == 2 and "is in use: pass --port N" in busy.stderr
    named = _view("--data-root", str(tmp_path), "--host", "viewer.example")
    assert named.returncode == 2 and "--host must be an IP address" in named.stderr
    assert [len(r.stderr.strip().splitlines()) for r in (missing, busy, named)] == [1, 1, 1]


def test_it_serves_an_empty_root_and_ctrl_c_stops_it(tmp_path):
    viewer = start_viewer(tmp_path)
    try:
        with urllib.request.urlopen(viewer.url, timeout=60) as answer:
            assert answer.status == 200 and "No runs in this data root yet" in answer.read().decode()
    finally:
        viewer.process.send_signal(signal.SIGINT)
        status = viewer.process.wait(timeout=60)
    assert status == 130 and "Traceback" not in viewer.process.stdout.read()
    assert list(tmp_path.iterdir()) == []
