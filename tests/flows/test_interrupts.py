"""Clean stops and loopback only, with the real command in its own process group, the way a terminal runs it.

Ctrl-C on the terminal (SIGINT to the whole group) stops `ragen train` in seconds with one line on stderr, exit
status 130 and no traceback; the manifest says where it stopped, the command's temporary Prefect server is gone and
`ragen resume` ends the run exactly like one that never stopped. While it trained, every listening socket of the
command and its children was on the loopback interface. A SIGKILLed command takes its Prefect server with it.
`ragen server start` works again after `ragen server stop`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from ipaddress import ip_address
from pathlib import Path
from urllib.request import ProxyHandler, build_opener

import psutil
import pytest
import torch

from ragen_cli.local_server import POOL, PROJECT_DIR, alive, read_state, stop
from ragen_core.storage import DataLake
from tests.flows.test_resume import DISTRIBUTED, RUN, _overrides, _ragen, _rows, _weights

pytestmark = pytest.mark.server
RAGEN = str(Path(sys.executable).with_name("ragen"))
STAGES = {"evaluate", "generate", "persist", "validate", "filter", "diagnose", "update", "commit"}  # flows/train.py


def _start(args: list[str], root: Path) -> tuple[subprocess.Popen, Path, Path]:
    """`ragen <args>` in a new session (its own process group, as a terminal's job) with no Prefect server
    configured, so it starts its own temporary one; stdout and stderr go to files."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    out, err = root.parent / f"{root.name}.out", root.parent / f"{root.name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [RAGEN, *args, "--data-root", str(root)],
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=PROJECT_DIR,
            start_new_session=True,
        )
    return process, out, err


def _wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the command exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.2)


def _servers(process: psutil.Process) -> list[psutil.Process]:
    """The command's temporary Prefect servers (uvicorn children)."""
    return [p for p in process.children(recursive=True) if "uvicorn" in " ".join(p.cmdline())]


def _listening(processes: list[psutil.Process]) -> list[tuple[str, int, str]]:
    """(address, port, command) of every listening TCP socket of these processes."""
    found = []
    for process in processes:
        for conn in process.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.append((conn.laddr.ip, conn.laddr.port, " ".join(process.cmdline()[1:4])))
    return found


def _gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still alive (zombies count as dead) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in processes if alive(p.pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def leftovers():
    """Whatever a failed test leaves running is killed (by the process ids it recorded)."""
    started: list[int] = []
    yield started
    for pid in started:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _train_until_committed(root: Path, tiny_model_dir: Path, leftovers: list[int]):
    """`ragen train` of the bandit config started as a terminal's job, once it committed iteration 1:
    (process, stdout file, stderr file, its psutil process, its lake)."""
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    process, out, err = _start(train, root)
    leftovers.append(process.pid)
    lake = DataLake(root)
    _wait_for(lambda: 1 in lake.committed_iterations(RUN), process, "committed iteration 1")
    return process, out, err, psutil.Process(process.pid), lake


def _stopped_run(lake: DataLake, out: Path, err: Path, how: str) -> tuple[str, dict, int]:
    """A run stopped mid-way by ``how``: no traceback, its manifest ``interrupted`` after its last committed iteration
    (before the end: else the test would prove nothing). Returns (stderr, manifest, last committed iteration)."""
    stderr = err.read_text()
    assert "Traceback" not in stderr + out.read_text()
    manifest = lake.read_manifest(RUN)
    last = lake.committed_iterations(RUN)[-1]
    assert last < 3, f"the run ended before the {how}; the test would prove nothing"
    assert manifest.status == "interrupted" and manifest.last_committed_iteration == last
    return stderr, manifest, last


def test_ctrl_c_stops_a_run_cleanly_on_loopback_only_and_resume_ends_it_exactly(
    tmp_path, tiny_model_dir, tiny_policy, prefect_server, whole_bandit_run, leftovers
):
    from ragen_core.training import ActorEngine, OptimConfig

    model, _ = tiny_policy  # DeepSpeed compiles a CPU op at its first engine: never inside the interrupted process
    ActorEngine(model, OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    root = tmp_path / "stopped"
    process, out, err, command, lake = _train_until_committed(root, tiny_model_dir, leftovers)
    # engines built and an update done: DeepSpeed's process group and every server of the command exist now
    children = command.children(recursive=True)
    leftovers.extend(child.pid for child in children)
    servers = _servers(command)
    assert len(servers) == 1, [" ".join(c.cmdline()) for c in children]
    sockets = _listening([command, *children])
    assert sockets, "the command's Prefect server listens: no sockets seen means the check itself is broken"
    assert [s for s in sockets if not ip_address(s[0]).is_loopback] == [], sockets

    started = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C on the terminal does: the whole foreground group
    try:
        returncode = process.wait(timeout=60)
    finally:
        seconds = time.monotonic() - started
    print(f"Ctrl-C to exit: {seconds:.1f} s")
    assert returncode == 130
    assert seconds <= 30, f"the stop took {seconds:.1f} s"  # about a second unloaded; the machine may be busy
    stderr, manifest, last = _stopped_run(lake, out, err, "Ctrl-C")
    stopped_in = (manifest.interrupted_iteration, manifest.interrupted_stage)
    # in the next iteration, or still in the commit stage of the one just committed (its last steps after the commit)
    assert stopped_in[0] == last + 1 and stopped_in[1] in STAGES or stopped_in == (last, "commit"), manifest
    where = f" in iteration {last + 1} ({stopped_in[1]})" if stopped_in[0] == last + 1 else ""
    assert stderr.splitlines() == [
        f"interrupted: run {RUN} stopped{where}; last committed iteration: {last}. "
        f"Continue it with: ragen resume {RUN} --data-root {root}"
    ]
    assert _gone(servers, 5) == [], "the temporary Prefect server outlived the command"

    api_url = prefect_server[0].api_url  # the rest needs no temporary server of its own (seconds saved)
    rc, output = _ragen(["resume", RUN], root, None, api_url)
    assert rc == 0 and "resumed at iteration" in output, output[-3000:]
    assert lake.read_manifest(RUN).status == "completed" and lake.committed_iterations(RUN) == [0, 1, 2, 3]
    whole = whole_bandit_run  # the same command and config, never stopped (tests/flows/conftest.py)
    expected, actual = _weights(whole), _weights(root)
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    for table in ("trajectories", "turns", "metrics", "evaluations"):
        assert _rows(root, table) == _rows(whole, table), table


def test_sigterm_stops_a_run_like_ctrl_c_with_one_line_and_status_143(tmp_path, tiny_model_dir, leftovers):
    root = tmp_path / "terminated"
    process, out, err, command, lake = _train_until_committed(root, tiny_model_dir, leftovers)
    servers = _servers(command)
    leftovers.extend(server.pid for server in servers)
    os.kill(process.pid, signal.SIGTERM)  # the command alone, as a scheduler or `kill` stops it
    assert process.wait(timeout=60) == 143
    stderr, _, _ = _stopped_run(lake, out, err, "SIGTERM")
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: run {RUN} stopped"), stderr
    assert f"Continue it with: ragen resume {RUN}" in lines[0]
    assert _gone(servers, 10) == [], "the temporary Prefect server outlived the command"


def test_a_sigkilled_run_leaves_no_prefect_server(tmp_path, tiny_model_dir, leftovers):
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    process, _, err = _start(train, tmp_path / "killed")
    leftovers.append(process.pid)
    command = psutil.Process(process.pid)
    lake = DataLake(tmp_path / "killed")
    _wait_for(lambda: lake.read_manifest(RUN) is not None, process, "the run's manifest")  # the server is up
    servers = _servers(command)
    assert len(servers) == 1, err.read_text()[-3000:]
    leftovers.extend(server.pid for server in servers)
    process.kill()  # the command only: its server runs in a session of its own, out of reach of the group
    process.wait(timeout=30)
    started = time.monotonic()
    assert _gone(servers, 10) == [], "the Prefect server outlived its SIGKILLed command"
    print(f"server gone {time.monotonic() - started:.1f} s after the SIGKILL")


def _server(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    return subprocess.run(
        [RAGEN, "server", *args], env=env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=400
    )


def test_server_start_stop_start_again(tmp_path):
    state_dir = tmp_path / "state"
    start = ["start", "--port", "0", "--state-dir", str(state_dir), "--no-worker", "--no-deploy"]
    try:
        for attempt in (1, 2):  # the second start finds the pool the first one created in the server's database
            done = _server(start)
            assert done.returncode == 0, f"start {attempt}: {done.stdout}\n{done.stderr}"
            state = read_state(state_dir)
            assert state is not None and alive(state.server_pid)
            server = psutil.Process(state.server_pid)
            sockets = _listening([server, *server.children(recursive=True)])
            assert {port for _, port, _ in sockets} == {state.port}, sockets
            assert all(ip_address(ip).is_loopback for ip, _, _ in sockets), sockets
            # the pool as the server's REST API holds it (what `prefect work-pool inspect` prints, without the ~4 s
            # of a second Prefect CLI process per start)
            with build_opener(ProxyHandler({})).open(f"{state.api_url}/work_pools/{POOL}", timeout=60) as answer:
                pool = json.load(answer)  # a pool the server does not hold is an HTTP error (404) raised here
            assert pool["name"] == POOL and pool["type"] == "process", pool
            done = _server(["stop", "--state-dir", str(state_dir)])
            assert done.returncode == 0 and "stopped" in done.stdout, done.stdout + done.stderr
            assert not alive(state.server_pid) and read_state(state_dir) is None
    finally:
        stop(state_dir)


def test_a_sigterm_prefect_caught_first_still_exits_143(monkeypatch):
    """A SIGTERM that lands inside a flow run reaches Prefect's handler, not ours: Prefect raises its
    TerminationSignal carrying the signal (here wrapped, as when a library's clean-up fails on the way out). The
    command still reports SIGTERM and exits 143; a Ctrl-C noted first is left as it was."""
    from prefect.exceptions import TerminationSignal

    from ragen_cli import interrupts
    from ragen_core import stops

    monkeypatch.setattr(interrupts, "_state", {"reported": False, "signal": signal.SIGINT})
    monkeypatch.setattr(stops, "_state", {"stop": False})  # this worker's own record stays as it was
    try:
        try:
            raise TerminationSignal(signal=signal.SIGTERM)
        except TerminationSignal:
            raise RuntimeError("Task run is not set") from None
    except RuntimeError as wrapped:
        wrapped.__context__ = TerminationSignal(signal=signal.SIGTERM)
        interrupts.note_stop(wrapped)
    assert interrupts.requested() and interrupts.exit_code() == 143 and interrupts.signal_name() == "SIGTERM"
    assert stops.requested()  # recorded for the core's waits (a query) too
    interrupts.note_stop(TerminationSignal(signal=signal.SIGINT))  # already noted: unchanged
    assert interrupts.exit_code() == 143
    monkeypatch.setattr(interrupts, "_state", {"reported": False, "signal": signal.SIGINT})
    monkeypatch.setattr(stops, "_state", {"stop": False})
    interrupts.note_stop(RuntimeError("an ordinary failure"))
    assert not interrupts.requested() and interrupts.exit_code() == 130 and not stops.requested()
