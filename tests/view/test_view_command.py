"""`ragen view` as a command: a user's mistake is one line on stderr before anything listens, and Ctrl-C stops it."""

from __future__ import annotations

import html
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from urllib.parse import quote, urlsplit

import psutil

from tests.view.conftest import REAL_RUN, REPO, fetch, start_viewer


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


def test_it_serves_an_empty_root_to_its_token_and_ctrl_c_stops_it(tmp_path):
    viewer = start_viewer(tmp_path)
    try:
        assert urlsplit(viewer.url).hostname == "127.0.0.1" and len(viewer.token) >= 24, viewer.url
        status, body = fetch(urllib.request.build_opener(), viewer.base + "/")
        assert status == 403 and "needs its access token" in body, "no token, no page: on loopback too"
        status, body = fetch(viewer.opener(visit=False), viewer.url)  # the printed URL, then its cookie
        assert status == 200 and "No runs in this data root yet" in body
    finally:
        viewer.process.send_signal(signal.SIGINT)
        status = viewer.process.wait(timeout=60)
    assert status == 130 and "Traceback" not in viewer.process.stdout.read()
    assert list(tmp_path.iterdir()) == []


def _resident(process: psutil.Process) -> int:
    """The resident memory of ``process`` and of its children (the viewer's filter queries run in them)."""
    total = 0
    for each in [process, *process.children(recursive=True)]:
        try:
            total += each.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def test_a_filter_that_builds_a_huge_value_is_refused_in_one_line(viewer):
    """Issue 66: this filter took the viewer from 221 MB to 6.0 GB and answered 200 after 51.6 s. DuckDB's memory
    limit does not bound one value a function builds; the filter's own process does."""
    opener, process = viewer.opener(), psutil.Process(viewer.process.pid)
    where = "(SELECT length(repeat('x', 3000000000))) > 0"
    before, peak, done = process.memory_info().rss, [_resident(process)], threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            peak.append(_resident(process))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    status, body = fetch(opener, viewer.base + f"/runs/{REAL_RUN}/iterations/1?where={quote(where)}", timeout=300)
    seconds = time.monotonic() - started
    done.set()
    watcher.join()
    message = re.search(r'<p class="error" id="error">(.*?)</p>', body, re.S)
    assert status == 400 and message, (status, body[-2000:])
    said = html.unescape(message.group(1))
    assert "out of memory (a filter's query may use 4 GB here)" in said and "\n" not in said
    assert seconds < 30, seconds
    grown = (max(peak) - peak[0]) / 2**20
    assert grown < 500 and process.memory_info().rss - before < 100 * 2**20, (grown, before)
