"""The launched update group's plumbing: launch commands, the token handshake, a real group started by the
``deepspeed`` launcher that restores, exports, reports a failing command with the worker's traceback and ends, and a
real ``torchrun`` group whose launcher files stay in the run's folder (no ``/tmp/torchelastic_*`` left behind)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.config import build_config
from ragen_core.storage import DataLake
from ragen_core.training.group import (
    GroupError,
    UpdateGroup,
    _accept,
    launch_command,
    process_alive,
    process_start_time,
)


def test_launch_commands(tmp_path):
    control = tmp_path / "control.json"
    torchrun = launch_command("torchrun", 2, 29500, control, None)
    assert torchrun[1:3] == ["-m", "torch.distributed.run"]
    assert torchrun[torchrun.index("--nproc_per_node") + 1] == "2"
    assert torchrun[torchrun.index("--master_addr") + 1] == "127.0.0.1"  # the group listens on loopback only
    assert torchrun[-4:] == ["-m", "ragen_core.training.worker", "--control-file", str(control)]
    assert torchrun[torchrun.index("--log-dir") + 1] == str(tmp_path / "torchelastic")  # the run's group folder
    hosts = tmp_path / "hostfile"
    deepspeed = launch_command("deepspeed", 4, 29500, control, str(hosts))
    assert deepspeed[1:3] == ["-m", "deepspeed.launcher.runner"]
    assert deepspeed[deepspeed.index("--hostfile") + 1] == str(hosts.resolve())
    assert deepspeed[deepspeed.index("--num_gpus") + 1] == "4"  # processes per node
    assert {"--no_local_rank", "--module"} <= set(deepspeed)
    assert "--hostfile" not in launch_command("deepspeed", 1, 29500, control, None)
    with pytest.raises(ValueError, match="unknown launcher"):
        launch_command("mpirun", 1, 29500, control, None)


def test_process_start_time_tells_a_pid_from_its_reuse():
    mine = process_start_time(os.getpid())
    assert mine is not None and mine == process_start_time(os.getpid())
    assert process_start_time(2**22 + 12345) is None  # no such process
    assert process_alive(os.getpid(), mine)
    assert not process_alive(os.getpid(), str(int(mine) + 1))  # same pid, another start time: a reused pid


def test_an_exited_but_unreaped_parent_counts_as_gone():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while not _zombie(child.pid) and time.monotonic() < deadline:  # exited; Popen has not reaped it yet
        time.sleep(0.05)
    try:
        assert _zombie(child.pid)
        assert not process_alive(child.pid, None)
    finally:
        child.wait()


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] == "Z"


class _Running:
    """Stands in for the launcher's Popen while the handshake is tested: it never exits."""

    returncode = None

    def poll(self):
        return None


def test_handshake_refuses_a_connection_without_the_token(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(1.0)
    port = server.getsockname()[1]

    def connect(token, delay):
        time.sleep(delay)
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall((json.dumps({"token": token, "world_size": 1, "pids": [1], "hosts": ["h"]}) + "\n").encode())
        return client

    clients = []
    threads = [
        threading.Thread(target=lambda t=t, d=d: clients.append(connect(t, d)))
        for t, d in (("guess", 0.0), ("secret", 0.5))
    ]
    for thread in threads:
        thread.start()
    connection, hello = _accept(server, _Running(), "secret", tmp_path / "log")
    for thread in threads:
        thread.join()
    assert hello["token"] == "secret" and hello["world_size"] == 1
    connection.close()
    server.close()
    for client in clients:
        client.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return not _zombie(pid)  # a zombie has exited; it only waits for its parent to reap it
    except OSError:
        return False  # gone in between


@pytest.mark.process  # a launched group
def test_a_deepspeed_launched_group_restores_exports_and_reports_failures(tmp_path, tiny_model_dir, tiny_policy):
    config = build_config(
        {"model": {"path": str(tiny_model_dir)}, "trainer": {"launcher": "deepspeed", "num_threads": 1}}
    )
    lake = DataLake(tmp_path)
    init = {
        "config": config.to_dict(),
        "data_root": str(lake.root),
        "run_id": "g",
        "model_dir": str(tiny_model_dir),
        "precision": "fp32",
    }
    group = UpdateGroup.start("deepspeed", 1, None, lake.update_group_dir("g"), init)
    try:
        assert group.world_size == 1 and len(group.worker_pids) == 1
        assert not list(lake.update_group_dir("g").glob("control-*.json"))  # the token file is gone
        exported = group.restore(None, [])  # no checkpoint, nothing to replay: the start weights
        weights = load_file(exported / "model.safetensors")
        model, _ = tiny_policy
        assert all(torch.equal(weights[name], p) for name, p in model.named_parameters())
        with pytest.raises(GroupError, match="no kept training rows|rank 0") as failure:
            group.update(0)  # nothing was published for iteration 0
        assert "Traceback" in str(failure.value)  # the worker's own traceback comes back
        deadline = time.monotonic() + 60
        while (group.process.poll() is None or any(map(_alive, group.worker_pids))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group.process.poll() is not None, "the launcher outlived its failed group"
        assert not any(map(_alive, group.worker_pids)), "a worker outlived its failed group"
        with pytest.raises(GroupError, match="stopped"):
            group.update(0)
    finally:
        group.stop()


@pytest.mark.process  # a worker process
def test_a_worker_exits_when_the_run_process_dies_even_while_busy():
    """The watchdog every worker runs: its 'run process' (here a short sleep) ends while the worker is busy (here
    sleeping 120 s, as in a long update); the worker exits with code 3 within seconds."""
    parent = subprocess.Popen(["sleep", "3"])
    watched = {"host": socket.gethostname(), "pid": parent.pid, "start": process_start_time(parent.pid)}
    code = (
        f"import time; from ragen_core.training.worker import _watch_parent; _watch_parent({watched!r}); "
        "time.sleep(120)"
    )
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        parent.wait(timeout=30)
        assert worker.wait(timeout=30) == 3
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.process  # a launched group
def test_a_torchrun_launched_group_keeps_its_launcher_files_in_the_run_folder(tmp_path, monkeypatch, tiny_model_dir):
    """torchrun makes a log folder per start (its ranks' error files): without ``--log-dir`` a
    ``<TMPDIR>/torchelastic_*`` that no one removes; here it lies in the run's update-group folder, and nothing is
    left in the temporary folder once the group has stopped."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))  # the group's processes make their temporary folders here
    config = build_config(
        {"model": {"path": str(tiny_model_dir)}, "trainer": {"launcher": "torchrun", "num_threads": 1}}
    )
    lake = DataLake(tmp_path / "data")
    init = {
        "config": config.to_dict(),
        "data_root": str(lake.root),
        "run_id": "t",
        "model_dir": str(tiny_model_dir),
        "precision": "fp32",
    }
    folder = lake.update_group_dir("t")
    group = UpdateGroup.start("torchrun", 1, None, folder, init)
    try:
        assert group.world_size == 1
    finally:
        group.stop()
    assert sorted(p.name for p in temporary.glob("torchelastic_*")) == []
    attempts = list((folder / "torchelastic").glob("*/attempt_0"))
    assert len(attempts) == 1, sorted(map(str, (folder / "torchelastic").rglob("*")))  # this start's, in the run
