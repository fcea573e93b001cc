"""One writer per run: a second writer (a real process: the CLI, or Python taking the lock) is refused while the first
holds the run, naming the holder and writing nothing; a lock left by a SIGKILLed holder is taken over; nested holds
in one process share the lock; the lock is the head process's, not its children's."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ragen_core.config import build_config
from ragen_core.run.record import new_manifest
from ragen_core.storage import DataLake
from ragen_core.storage.lease import read_lease
from ragen_core.storage.locks import (
    RunLockedError,
    acquire,
    check_not_held,
    lock_path,
    read_holder,
    release,
    run_writer,
    takeover_note,
)
from schemas.manifest import RunManifest

pytestmark = pytest.mark.process  # writers in other processes

RUN = "r"
HOLDER = textwrap.dedent(
    """
    import os, sys, time, subprocess
    from ragen_core.storage.locks import acquire
    acquire(sys.argv[1], sys.argv[2], command=["holder-under-test"])
    child = None
    if sys.argv[3] == "spawn":  # a launched child (like a torchrun group): it must not inherit the lock
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], close_fds=False).pid
    elif sys.argv[3] == "fork":  # a forked child shares the open file, so it keeps the lock alive
        child = os.fork()
        if child == 0:
            time.sleep(120)
            os._exit(0)
    print(os.getpid(), child, flush=True)
    time.sleep(120)
    """
)
PROBE = (
    "import sys\nfrom ragen_core.storage.locks import run_writer\n"
    "with run_writer(sys.argv[1], sys.argv[2]):\n    print('locked')"
)


def _holder(root: Path, mode: str = "plain") -> tuple[subprocess.Popen, int | None]:
    """A separate Python process that takes the run's lock and keeps it; returns it and its child's pid."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), RUN, mode], stdout=subprocess.PIPE, text=True, cwd=_project()
    )
    pid, child = process.stdout.readline().split()
    assert int(pid) == process.pid
    return process, None if child == "None" else int(child)


def _project() -> Path:
    return Path(__file__).resolve().parents[2]


def _probe(root: Path, run_id: str = RUN) -> subprocess.CompletedProcess:
    """Another process trying to take the lock (and releasing it when it exits)."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(root), run_id], capture_output=True, text=True, cwd=_project(), timeout=60
    )


def _ragen(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "RAGEN_FAULT"}
    script = str(Path(sys.executable).with_name("ragen"))
    return subprocess.run([script, *args], capture_output=True, text=True, env=env, timeout=120, cwd=_project())


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every path under ``root`` with its modification time, size and content digest; the writer lease, which its
    holder renews (a new token each time), by its holder's pid and host alone."""
    found = {}
    for path in sorted(root.rglob("*")):
        stat = path.stat()
        if path.name == "writer.lease":
            holder = read_lease(path)
            found[str(path.relative_to(root))] = (holder["pid"], stat.st_size, holder["host"])
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        found[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_size, digest)
    return found


def _stop(process: subprocess.Popen, *pids: int | None) -> None:
    for pid in (process.pid, *pids):
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    process.wait(timeout=30)


def test_a_second_writer_is_refused_naming_the_holder_and_writing_nothing(tmp_path):
    lake = DataLake(tmp_path)
    lake.write_manifest(RUN, new_manifest(build_config(), RUN, None, ["ragen", "train"]))
    holder, _ = _holder(tmp_path)
    try:
        record = read_holder(lock_path(lake.root, RUN))
        assert record["pid"] == holder.pid and record["host"] == socket.gethostname()
        before = _snapshot(tmp_path)
        attempts = {
            "resume": _ragen("resume", RUN, "--data-root", str(tmp_path)),
            "train": _ragen("train", "--run-id", RUN, "--data-root", str(tmp_path), "trainer.iterations=1"),
            "retrain": _ragen(
                "retrain",
                "--from",
                "SELECT * FROM trajectories",
                "--init",
                str(tmp_path / "none"),
                "--run-id",
                RUN,
                "--data-root",
                str(tmp_path),
            ),
        }
        for command, result in attempts.items():
            output = " ".join((result.stdout + result.stderr).split())  # rich may wrap the message
            assert result.returncode != 0, command
            assert f"pid {holder.pid} on host {socket.gethostname()}" in output, (command, output)
            assert "holder-under-test" in output and "Traceback" not in output, (command, output)
        probe = _probe(tmp_path)
        assert probe.returncode != 0 and f"pid {holder.pid}" in probe.stderr and "RunLockedError" in probe.stderr
        with pytest.raises(RunLockedError, match=f"pid {holder.pid} on host"):
            acquire(tmp_path, RUN)
        assert _snapshot(tmp_path) == before  # refused writers wrote nothing (no Prefect home, no log, no lock)
    finally:
        _stop(holder)


def test_a_lock_left_by_a_sigkilled_holder_is_taken_over(tmp_path):
    DataLake(tmp_path).write_manifest(RUN, new_manifest(build_config(), RUN, None, ["ragen", "train"]))
    holder, _ = _holder(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    path = lock_path(tmp_path, RUN)
    assert read_holder(path)["pid"] == holder.pid  # the killed holder's record is still in the file
    lock = acquire(tmp_path, RUN)
    try:
        assert lock.taken_over["pid"] == holder.pid
        assert f"left by pid {holder.pid}" in takeover_note(lock)
        assert read_holder(path)["pid"] == os.getpid()
        assert _probe(tmp_path).returncode != 0  # and it is really held again
    finally:
        release(lock)
    assert path.read_text() == ""  # released cleanly: nothing to take over next time
    probe = _probe(tmp_path)
    assert probe.returncode == 0 and probe.stdout.strip() == "locked", probe.stderr


def test_the_lock_is_the_head_process_s_not_its_launched_children_s(tmp_path):
    holder, child = _holder(tmp_path, "spawn")
    try:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        os.kill(child, 0)  # the launched child is still alive ...
        with run_writer(tmp_path, RUN) as lock:  # ... and does not hold the run
            assert lock.taken_over["pid"] == holder.pid
    finally:
        _stop(holder, child)


def test_a_forked_child_of_a_dead_holder_is_named_in_the_refusal(tmp_path):
    holder, child = _holder(tmp_path, "fork")
    try:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with pytest.raises(RunLockedError, match="That process is gone, but a process it started still holds"):
            acquire(tmp_path, RUN)
    finally:
        _stop(holder, child)
    deadline = time.monotonic() + 30
    while _probe(tmp_path).returncode != 0:  # once the child is gone too, the run is free
        assert time.monotonic() < deadline, "the lock outlived every process that had it open"
        time.sleep(0.5)


def test_a_second_take_in_the_holding_process_is_refused(tmp_path):
    lake = DataLake(tmp_path)
    lake.write_manifest(RUN, RunManifest(run_id=RUN, status="running", updated_at="2026-01-01T00:00:00+00:00"))
    with run_writer(tmp_path, RUN) as outer:
        with pytest.raises(RunLockedError, match="already open for writing in this process"):
            acquire(tmp_path, RUN)  # one taker per process: its entry, which hands the open run down
        assert takeover_note(outer) is None
        assert _probe(tmp_path).returncode != 0  # the refused take changed nothing: still held
    assert _probe(tmp_path).returncode == 0
    assert json.loads(lake.run_dir(RUN).joinpath("manifest.json").read_text())["run_id"] == RUN
    assert lock_path(tmp_path, RUN).read_text() == ""


def test_a_lock_of_a_run_without_manifest_leaves_no_trace(tmp_path):
    with run_writer(tmp_path, "new-run"):
        assert lock_path(tmp_path, "new-run").is_file()
    assert not (tmp_path / "runs" / "new-run").exists()  # a command that stopped before writing leaves nothing
    with run_writer(tmp_path, "new-run"):  # and the lock works again
        assert _probe(tmp_path, "new-run").returncode != 0


def test_the_check_before_the_lock_names_a_live_holder_and_creates_nothing(tmp_path):
    check_not_held(tmp_path, RUN)  # no run, no lock file: free, and nothing was created
    assert list(tmp_path.iterdir()) == []
    DataLake(tmp_path).write_manifest(RUN, RunManifest(run_id=RUN, status="running"))
    with run_writer(tmp_path, RUN):
        check_not_held(tmp_path, RUN)  # this process's own hold is no refusal
    check_not_held(tmp_path, RUN)  # a released lock file: free
    holder, _ = _holder(tmp_path)
    try:
        before = _snapshot(tmp_path)
        with pytest.raises(RunLockedError, match=f"pid {holder.pid} on host .*holder-under-test"):
            check_not_held(tmp_path, RUN)
        assert _snapshot(tmp_path) == before  # the refused check wrote nothing
    finally:
        _stop(holder)
    check_not_held(tmp_path, RUN)  # the holder is gone: free again, and the check kept no lock
    assert _probe(tmp_path).returncode == 0
