"""The update group across nodes, without starting one (tests/flows/test_launcher.py starts two on loopback): the
endpoint's form, the config's checks, the endpoint left out of the config hash and of a resume's changes, the two
torchrun command lines (node 0's and a joining node's), the reading of a lost connection, the ranks' check of the
world size and a joined rank's watch on node 0's endpoint."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen_core.config import ConfigError, build_config
from ragen_core.config.optimisation import rendezvous_address
from ragen_core.run.decisions import config_changes
from ragen_core.training.group import launch_command
from ragen_core.training.nodes import check_join, join_command
from ragen_core.training.worker import _check_world, lost_peer

TWO_NODES = ["trainer.launcher=torchrun", "trainer.nnodes=2", "actor.zero_stage=2"]


@pytest.mark.parametrize(
    ("endpoint", "address"),
    [
        ("node0.cluster:29400", ("node0.cluster", 29400)),
        ("10.0.0.7:1", ("10.0.0.7", 1)),
        ("[fd00::1]:65535", ("fd00::1", 65535)),
        ("gpu-a_1:29500", ("gpu-a_1", 29500)),
    ],
)
def test_an_endpoint_is_host_and_port(endpoint, address):
    assert rendezvous_address(endpoint) == address


@pytest.mark.parametrize(
    "endpoint",
    [
        "node0",
        ":29400",
        "node0:0",
        "node0:65536",
        "node0:-1",
        "-x:29400",
        "a b:1",
        "fd00::1:29400",
        "h:1a",
        "n:²",
        "n:٣",
    ],
)
def test_a_malformed_endpoint_is_refused_naming_the_form(endpoint):
    with pytest.raises(ValueError, match=r"is not HOST:PORT: .* e\.g\. node0\.cluster:29400"):
        rendezvous_address(endpoint)


def test_several_nodes_are_checked_at_load_time():
    config = build_config({}, [*TWO_NODES, "trainer.rdzv_endpoint=node0:29400"])
    assert (config.trainer.nnodes, config.trainer.rdzv_endpoint, config.trainer.nproc) == (2, "node0:29400", 1)
    cases = [
        (
            ["trainer.nnodes=2", "trainer.rdzv_endpoint=node0:29400", "actor.zero_stage=2"],
            "set trainer.launcher=torchrun",
        ),
        (
            ["trainer.launcher=deepspeed", "trainer.nnodes=2", "trainer.rdzv_endpoint=n:1", "actor.zero_stage=2"],
            "DeepSpeed launcher spans nodes by trainer.hostfile",
        ),
        (TWO_NODES, "go together"),
        (["trainer.launcher=torchrun", "trainer.rdzv_endpoint=node0:29400"], "go together"),
        (["trainer.launcher=torchrun", "trainer.nnodes=2", "trainer.rdzv_endpoint=n:1"], "needs actor.zero_stage"),
        ([*TWO_NODES, "trainer.rdzv_endpoint=node0"], "is not HOST:PORT"),
    ]
    for overrides, needle in cases:
        with pytest.raises(ConfigError, match=needle):
            build_config({}, overrides)


def test_where_the_nodes_meet_is_no_part_of_the_config():
    one = build_config({}, [*TWO_NODES, "trainer.rdzv_endpoint=node0:29400"])
    other = build_config({}, [*TWO_NODES, "trainer.rdzv_endpoint=node7:31000"])
    assert one.config_hash() == other.config_hash()
    assert config_changes(one.to_dict(), other.to_dict()) == []
    # one node: the new keys leave the hash as it was before they existed (the trees without them hash alike)
    default = build_config({}, [])
    assert "nnodes" not in default.hashed_tree()["trainer"] and "rdzv_endpoint" not in default.hashed_tree()["trainer"]
    assert "nnodes" in one.hashed_tree()["trainer"] and one.config_hash() != default.config_hash()
    three = build_config(
        {}, ["trainer.launcher=torchrun", "trainer.nnodes=3", "actor.zero_stage=2", "trainer.rdzv_endpoint=n:1"]
    )
    assert config_changes(one.to_dict(), three.to_dict()) == ["trainer.nnodes"]  # the group's size is a change


def test_node_zero_and_a_joining_node_start_torchrun_with_fixed_node_ranks(tmp_path):
    control = tmp_path / "control.json"
    node0 = launch_command("torchrun", 2, 29400, control, None, 3, "node0.cluster")
    flags = {node0[i]: node0[i + 1] for i in range(3, 15, 2)}
    assert flags == {
        "--nnodes": "3",
        "--node-rank": "0",
        "--nproc_per_node": "2",
        "--master_addr": "node0.cluster",
        "--master_port": "29400",
        "--log-dir": str(tmp_path / "torchelastic"),
    }
    assert node0[-2:] == ["--control-file", str(control)]
    node2 = join_command("node0.cluster:29400", 3, 2, 2, tmp_path / "logs")
    assert node2[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert {node2[i]: node2[i + 1] for i in range(3, 15, 2)} == {
        **flags,
        "--node-rank": "2",
        "--log-dir": str(tmp_path / "logs"),
    }
    assert node2[-3:] == ["-m", "ragen_core.training.worker", "--join"]  # no control file, no token


@pytest.mark.parametrize(
    ("nnodes", "node_rank", "nproc", "needle"),
    [
        (2, 0, 1, "node 0 is the run's own host"),
        (2, 2, 1, "not one of the joining nodes 1..1"),
        (1, 1, 1, "at least 2"),
        (2, 1, 0, "--nproc must be at least 1"),
    ],
)
def test_a_join_that_cannot_be_is_refused(nnodes, node_rank, nproc, needle):
    with pytest.raises(ValueError, match=needle):
        check_join("node0:29400", nnodes, node_rank, nproc)


def test_a_lost_connection_is_told_from_any_other_failure():
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.1.2.3]:13744: Connection reset by peer"
    )
    assert lost_peer(gloo) == "10.1.2.3"
    assert lost_peer(RuntimeError("[pair.cc:598] Connection closed by peer [127.0.0.1]:40000")) == "127.0.0.1"
    nccl = "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."
    assert lost_peer(RuntimeError(nccl)) == "another rank"
    assert lost_peer(RuntimeError("Expected all tensors to be on the same device")) is None
    # a timeout is no lost connection: a slow or stuck rank is another failure
    assert lost_peer(RuntimeError("[gloo] Timed out waiting 600000ms for recv operation to complete")) is None
    assert lost_peer(ValueError("Connection reset by peer")) is None  # not what a collective raises


@pytest.mark.process  # the worker program
def test_a_worker_joined_as_rank_zero_stops_at_once(tmp_path):
    """A join whose node would hold rank 0 (never the case through `ragen group join`) exits before any import."""
    env = {"RANK": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "ragen_core.training.worker", "--join"],
        env=env,
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "rank 0 runs on the run's own host" in done.stderr


@pytest.mark.parametrize(
    ("world", "nodes", "local", "refused"),
    [
        ("2", "2", "1", False),
        ("8", "2", "4", False),
        ("3", "2", "1", True),
        ("3", "2", "2", True),
        (None, None, None, False),
    ],
)
def test_every_node_must_hold_as_many_ranks(monkeypatch, world, nodes, local, refused):
    """torchrun numbers a node's ranks after those of the nodes before it: a joined node with another --nproc would
    shift every rank (node 0 with 1 rank and a node with 2 make 3), so each rank refuses such a group."""
    for name, value in (("WORLD_SIZE", world), ("GROUP_WORLD_SIZE", nodes), ("LOCAL_WORLD_SIZE", local)):
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    why = _check_world()
    assert (why is not None) == refused
    if refused:
        assert f"the group's 2 nodes hold {world} ranks, this one {local}" in why and "--nproc" in why


@pytest.mark.process  # a rank's watch in a process of its own
def test_a_joined_rank_exits_when_node_zero_is_gone():
    """The watch of a joined rank: while node 0's endpoint answers it stays; once it is gone (3 misses) it exits."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    program = (
        "import time; from ragen_core.training.worker import _watch_endpoint\n"
        f"_watch_endpoint('127.0.0.1', {port}, interval=0.2, misses=3)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", program], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        assert child.poll() is None  # the endpoint answers: the rank stays
        listener.close()
        started = time.monotonic()
        assert child.wait(timeout=30) == 3
        assert time.monotonic() - started < 10
        assert f"node 0's endpoint 127.0.0.1:{port} is gone" in child.stderr.read()
    finally:
        child.kill()
        listener.close()
