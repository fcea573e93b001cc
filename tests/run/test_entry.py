"""One entry for a run (``ragen_core.run.entry.open_run``), without Prefect: the id checked before anything is
created, the lake made once or the caller's used, the writer lock taken once per process (an inner entry of the same
run joins the outer hold and leaves the takeover note to it), a second process refused naming the holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen_core.run.entry import check_run_id, open_run, run_lake
from ragen_core.storage import DataLake
from ragen_core.storage.locks import RunLockedError, lock_path, read_holder
from ragen_core.storage.names import InvalidRunIdError
from schemas.manifest import RunManifest

PROBE = (
    "import sys\nfrom ragen_core.run.entry import open_run\nfrom ragen_core.storage import LakeError\n"
    "try:\n    with open_run(sys.argv[1], sys.argv[2]):\n        print('opened')\n"
    "except LakeError as exc:\n    print(exc)\n    sys.exit(3)"
)


def _probe(root: Path, run_id: str) -> subprocess.CompletedProcess:
    """Another process opening the run (and closing it when it exits)."""
    project = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-c", PROBE, str(root), run_id]
    return subprocess.run(command, capture_output=True, text=True, cwd=project, timeout=60)


@pytest.mark.parametrize("run_id", ["a/b", "..", "*", ""])
def test_a_malformed_id_is_refused_before_anything_is_created(tmp_path, run_id):
    with pytest.raises(InvalidRunIdError, match="^run id .* letters, digits") as refused:
        check_run_id(run_id)
    with pytest.raises(InvalidRunIdError) as opened, open_run(tmp_path / "lake", run_id):
        pass
    assert str(opened.value) == str(refused.value)
    assert not (tmp_path / "lake").exists()
    assert check_run_id(None) is None and check_run_id("ok-1.2_3") == "ok-1.2_3"


def test_the_lake_is_made_once_or_the_callers_is_used(tmp_path):
    lake = DataLake(tmp_path)
    assert run_lake(lake) is lake
    with open_run(lake, "r") as run:
        assert run.lake is lake and run.run_id == "r"
    with open_run(str(tmp_path), "r") as run:
        assert isinstance(run.lake, DataLake) and run.lake.root == lake.root


def test_a_second_entry_in_the_process_and_a_second_process_are_refused(tmp_path):
    lake = DataLake(tmp_path)
    lake.write_manifest("r", RunManifest(run_id="r", status="running"))
    with open_run(lake, "r", ["ragen", "train"]):  # the command
        assert read_holder(lock_path(lake.root, "r"))["pid"] == os.getpid()
        with pytest.raises(RunLockedError, match="already open for writing in this process"), open_run(lake, "r"):
            pass  # one taker per process: the command hands its open run down, nothing takes it again
        refused = _probe(tmp_path, "r")  # still held after the refused entry
        assert refused.returncode == 3, refused.stderr
        assert refused.stdout.startswith(f"run 'r' is being written by pid {os.getpid()} on host ")
        assert "`ragen train`" in refused.stdout
    assert lock_path(lake.root, "r").read_text() == ""  # released: nothing left to take over
    opened = _probe(tmp_path, "r")
    assert (opened.returncode, opened.stdout.strip()) == (0, "opened"), opened.stderr


def test_the_entry_reports_a_lock_taken_over_from_a_dead_holder(tmp_path):
    lake = DataLake(tmp_path)
    lake.write_manifest("r", RunManifest(run_id="r", status="running"))
    stale = {"run_id": "r", "pid": 99999999, "host": "gone", "since": "2026-01-01T00:00:00+00:00", "command": "x"}
    path = lock_path(lake.root, "r")
    path.write_text(json.dumps(stale))  # a record under a free lock: its holder died without releasing it
    with open_run(lake, "r") as run:
        assert run.takeover_note == (
            "took over the lock of run 'r' left by pid 99999999 on host gone (since 2026-01-01T00:00:00+00:00), "
            "which ended without releasing it"
        )
    with open_run(lake, "r") as again:
        assert again.takeover_note is None  # released cleanly: nothing taken over


def test_a_run_opened_and_closed_without_a_manifest_leaves_no_trace(tmp_path):
    lake = DataLake(tmp_path)
    with open_run(lake, "new"):
        assert lock_path(lake.root, "new").is_file()
    assert not lake.run_dir("new").exists()


HOLD = (
    "import sys, time\nfrom ragen_core.run.entry import open_run\n"
    "with open_run(sys.argv[1], sys.argv[2]):\n    print('opened', flush=True)\n    time.sleep(1.5)"
)


def test_a_waiting_entry_opens_the_run_once_the_other_process_is_done(tmp_path):
    """A bootstrap's build: a second run building the same bootstrap model waits for the first instead of failing."""
    project = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), "b"], stdout=subprocess.PIPE, text=True, cwd=project
    )
    try:
        assert holder.stdout.readline().strip() == "opened"
        started = time.monotonic()
        with open_run(tmp_path, "b", wait=True) as run:
            assert time.monotonic() - started > 0.5  # it waited for the holder's 1.5 s hold to end
            assert read_holder(lock_path(run.lake.root, "b"))["pid"] == os.getpid()
    finally:
        holder.kill()
        holder.wait(timeout=30)
