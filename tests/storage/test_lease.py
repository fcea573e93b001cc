"""The writer lock across hosts (issue 70): processes that stand for other hosts (each its own host name, on a
filesystem whose ``flock`` holds on one host only: the processes drop it, as some network filesystems silently do)
share one data root. The lease alone keeps one writer per run: a second host is refused naming the first; a killed
host's run is taken over only once its lease expired; a holder stopped past its lease finds it taken and does not
commit; of many claimants of an expired lease exactly one wins."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ragen_core.storage.files import LakeError
from ragen_core.storage.layout import writer_lease_file
from ragen_core.storage.lease import lease_seconds, read_lease, stale
from ragen_core.storage.locks import lock_path

pytestmark = pytest.mark.process  # writers in other processes

RUN = "r"
LEASE_S = 2.0
# Another host: its own name and kernel, and a filesystem that drops flock across hosts (flock does nothing at all
# here, which is what a host sees of another host's flock on such a filesystem)
OTHER_HOST = textwrap.dedent(
    """
    import fcntl, socket, sys
    import ragen_core.storage.lease as lease
    socket.gethostname = lambda: sys.argv[1]
    lease.machine = lambda: sys.argv[1]  # another machine's kernel (its boot id)
    fcntl.flock = lambda *args: None
    """
)
HOLD = OTHER_HOST + textwrap.dedent(
    """
    from ragen_core.storage import DataLake
    from ragen_core.storage.locks import acquire
    lock = acquire(sys.argv[2], sys.argv[3], command=["writer-on-" + sys.argv[1]])
    print("held", flush=True)
    if sys.stdin.readline().strip() == "release":  # the test says when to commit, or to let go
        from ragen_core.storage.locks import release
        release(lock)
        print("released", flush=True)
        sys.exit(0)
    lake = DataLake(sys.argv[2])
    for write in (lambda: lake.commit_iteration(sys.argv[3], 0, {"by": sys.argv[1]}),
                  lambda: lake.mark_stage_done(sys.argv[3], 0, "validate")):
        try:
            write()
        except Exception as exc:
            print(type(exc).__name__, exc, flush=True)
        else:
            print("written", flush=True)
    """
)
WAIT = OTHER_HOST + textwrap.dedent(
    """
    import time
    from ragen_core.storage.locks import acquire
    started = time.monotonic()
    lock = acquire(sys.argv[2], sys.argv[3], command=["writer-on-" + sys.argv[1]], wait=True)
    print("won after", round(time.monotonic() - started, 1), lock.taken_over, flush=True)
    """
)
TAKE = OTHER_HOST + textwrap.dedent(
    """
    import time
    from ragen_core.storage.locks import RunLockedError, acquire, takeover_note
    if len(sys.argv) > 4:
        time.sleep(max(0.0, float(sys.argv[4]) - time.time()))  # all claimants at once
    try:
        lock = acquire(sys.argv[2], sys.argv[3], command=["writer-on-" + sys.argv[1]])
    except RunLockedError as exc:
        print("refused", exc, flush=True)
    else:
        print("won", lock.lease.record["token"], takeover_note(lock), flush=True)
        time.sleep(float(sys.argv[5]) if len(sys.argv) > 5 else 0)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "RAGEN_LOCK_LEASE_S": str(LEASE_S)}


def _project() -> Path:
    return Path(__file__).resolve().parents[2]


def _start(script: str, host: str, root: Path, *extra: str, **pipes: int) -> subprocess.Popen:
    """``script`` in a process standing for ``host`` on the data root ``root`` (its output piped, as text)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, host, str(root), RUN, *extra],
        stdout=subprocess.PIPE,
        text=True,
        cwd=_project(),
        env=_env(),
        **pipes,
    )


def _holder(root: Path, host: str) -> subprocess.Popen:
    process = _start(HOLD, host, root, stdin=subprocess.PIPE)
    assert process.stdout.readline().strip() == "held"
    return process


def _take(root: Path, host: str, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", TAKE, host, str(root), RUN, *extra],
        capture_output=True,
        text=True,
        cwd=_project(),
        env=_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _lease(root: Path) -> dict:
    return read_lease(writer_lease_file(lock_path(root, RUN)))


def test_a_writer_on_another_host_is_refused_naming_the_holder(tmp_path):
    holder = _holder(tmp_path, "node-a")
    try:
        before = _lease(tmp_path)
        assert before["host"] == "node-a" and before["pid"] == holder.pid and before["seconds"] == LEASE_S
        answer = _take(tmp_path, "node-b")
        assert answer.startswith("refused run 'r' is being written by pid")
        assert f"pid {holder.pid} on host node-a" in answer and "writer-on-node-a" in answer
        assert "if that host is gone, the run can be resumed here once the lease has gone 2 s" in answer
        after = _lease(tmp_path)
        assert after["pid"] == before["pid"] and after["host"] == "node-a"  # the refused writer changed nothing
        assert sorted(p.name for p in lock_path(tmp_path, RUN).parent.iterdir()) == ["writer.lease", "writer.lock"]
        time.sleep(LEASE_S * 1.5)  # the holder renews: still refused after the lease's length
        assert _take(tmp_path, "node-b").startswith("refused")
        assert _lease(tmp_path)["renewed_at"] > before["renewed_at"]
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_host_s_run_is_taken_over_once_its_lease_expired(tmp_path):
    holder = _holder(tmp_path, "node-a")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.time()
    lease = _lease(tmp_path)
    assert not stale(lease)
    first = _take(tmp_path, "node-b")
    if time.time() - lease["renewed_at"] < LEASE_S:  # asked within the lease: refused
        assert first.startswith("refused") and "on host node-a" in first
    time.sleep(max(0.0, lease["renewed_at"] + LEASE_S + 0.2 - time.time()))
    assert stale(lease) and time.time() - killed_at < 10
    answer = _take(tmp_path, "node-b")
    assert answer.startswith("won ")
    assert f"left by pid {holder.pid} on host node-a" in answer


def test_a_holder_stopped_past_its_lease_finds_it_taken_and_does_not_commit(tmp_path):
    holder = _holder(tmp_path, "node-a")
    try:
        holder.send_signal(signal.SIGSTOP)  # a stalled host: no renewal
        time.sleep(LEASE_S + 0.5)
        taker = _start(TAKE, "node-b", tmp_path, "0", "30")  # node-b takes the run and keeps it
        assert taker.stdout.readline().startswith("won ")
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("commit\n")
        holder.stdin.flush()
        said = holder.stdout.readline().strip()
        assert said.startswith("LeaseLostError this process no longer holds the writer lease of run 'r'"), said
        assert "taken over by pid" in said and "on host node-b" in said or "not renewed for more than" in said
        assert holder.stdout.readline().startswith("LeaseLostError")  # nor any other write of the run's lake
        marker = tmp_path / "_commits" / RUN / "iteration=0.json"
        assert not marker.exists()  # nothing committed by the writer that lost the run
        assert not (tmp_path / "_staging").exists() or not list((tmp_path / "_staging").rglob("*validate*"))
        assert _lease(tmp_path)["host"] == "node-b"  # and the holder's renewals did not take it back
        taker.kill()
        taker.wait()
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_stopped_past_its_lease_that_nobody_took_goes_on(tmp_path):
    """Ctrl-Z, then `fg` minutes later: nobody took the run meanwhile, so the holder renews its lease and writes."""
    holder = _holder(tmp_path, "node-a")
    try:
        token = _lease(tmp_path)["token"]
        holder.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_S * 2)
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("commit\n")
        holder.stdin.flush()
        assert [holder.stdout.readline().strip() for _ in range(2)] == ["written", "written"]
        assert (tmp_path / "_commits" / RUN / "iteration=0.json").is_file()
        renewed = _lease(tmp_path)
        assert renewed["host"] == "node-a" and renewed["token"] != token  # every renewal writes a new token
    finally:
        holder.kill()
        holder.wait()


def test_a_waiting_writer_waits_for_another_machine_s_lease_then_takes_the_run(tmp_path):
    holder = _holder(tmp_path, "node-a")
    waiter = _start(WAIT, "node-b", tmp_path, stderr=subprocess.PIPE)
    try:
        time.sleep(LEASE_S * 2)  # the holder renews: the waiter keeps waiting, past the lease's length
        assert waiter.poll() is None
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        said, errors = waiter.communicate(timeout=60)
        assert said.startswith("won after") and said.strip().endswith("None"), said + errors  # released, not stale
        assert float(said.split()[2]) > LEASE_S  # it waited past a lease that was renewed
    finally:
        for process in (holder, waiter):
            process.kill()
            process.wait()


def test_of_many_claimants_of_an_expired_lease_exactly_one_wins(tmp_path):
    holder = _holder(tmp_path, "node-a")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    time.sleep(LEASE_S + 0.3)
    start = time.time() + 3.0  # every claimant started and imported by then
    claimants = [_start(TAKE, f"node-{i}", tmp_path, str(start), "5", stderr=subprocess.PIPE) for i in range(6)]
    answers = [c.communicate(timeout=120)[0].strip() for c in claimants]
    winners = [a for a in answers if a.startswith("won ")]
    assert len(winners) == 1, answers
    assert all(a.startswith("refused") for a in answers if a not in winners), answers
    left = sorted(p.name for p in lock_path(tmp_path, RUN).parent.iterdir())
    assert left == ["writer.lease", "writer.lock"]  # no claimant's new file nor a lease set aside is left behind


def test_the_lease_length_is_checked(monkeypatch):
    for bad in ("soon", "0", "1e9"):
        monkeypatch.setenv("RAGEN_LOCK_LEASE_S", bad)
        with pytest.raises(LakeError, match=f"RAGEN_LOCK_LEASE_S='{bad}'"):
            lease_seconds()
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "45")
    assert lease_seconds() == 45.0
    monkeypatch.delenv("RAGEN_LOCK_LEASE_S")
    assert lease_seconds() == 60.0


def test_a_holder_s_pid_is_alive_only_when_it_names_a_process():
    """A lease or lock record's pid read back (planted, damaged) never raises and never names a process group: 0,
    a negative number, one past the kernel's range, a bool or a string name none; this process is alive, a reaped
    child is not."""
    import subprocess
    import sys

    from ragen_core.storage.lease import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert [pid_alive(p) for p in (0, -1, 2**63, True, "1", None, child.pid, os.getpid())] == [False] * 7 + [True]
