"""The update group on two nodes (issue 70, item 2): node 0 is the run's own host, node 1 joins with `ragen group
join` from a working folder of its own, as another host would; torchrun's static rendezvous on loopback.

Node r holds the global ranks r*nproc .. r*nproc+nproc-1, so two nodes of one rank each are the same data-parallel
group as one node of two ranks: the same shards, the same reduction (g0 + g1, exact). The run on two nodes is killed
where it hurts most, inside iteration 3's update by the death of node 1 (its launcher and its rank, SIGKILL), and
resumed with node 1 joining again; its rows and final weights must equal, bit for bit, the uninterrupted run of one
node with two ranks.
"""

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake
from ragen_core.training.distributed import free_port
from ragen_core.training.group import process_alive
from tests.flows.test_launcher import DISTRIBUTED, RUN, _overrides, _ragen, _rows

pytestmark = pytest.mark.slow  # a one-node run, a two-node run killed with its node and its resume (about 2.5 min)
CLUSTER = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"
ONE_NODE = ["trainer.launcher=torchrun", "trainer.nproc=2", "actor.zero_stage=2"]


def _documented(port):
    """docs/cluster.md's commands for two nodes, as the test runs them on loopback: the blocks of "The update on
    several nodes" (the first: start and join; the second: resume and join again), node0 -> 127.0.0.1, its port ->
    ``port``, ``<run id>`` -> the test's run. Returns {"train": args, "join": args, "resume": args} (no "ragen")."""
    section = CLUSTER.read_text().split("## The update on several nodes", 1)[1]
    blocks = [block.split("```", 1)[0] for block in section.split("```bash")[1:3]]
    commands = {}
    for block in blocks:
        block = block.replace("node0:29400", f"127.0.0.1:{port}").replace("<run id>", RUN)
        for line in block.splitlines():
            if line.startswith("ragen "):
                commands[line.split()[1]] = shlex.split(line)[1:]
    assert set(commands) == {"train", "group", "resume"}, commands
    return commands


def _join(folder, port, fault=None):
    """docs/cluster.md's `ragen group join` as the other host runs it: its own working folder, its own session (its
    death kills its launcher's group, never the test)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    if fault:
        env["RAGEN_FAULT"] = fault
    folder.mkdir(exist_ok=True)
    log = open(folder / f"join-{port}.log", "w")  # noqa: SIM115 (closed by _finish)
    command = [str(Path(sys.executable).with_name("ragen")), *_documented(port)["group"]]
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, log


def _finish(join):
    process, log = join
    try:
        process.wait(timeout=120)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
    return process.returncode, Path(log.name).read_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tiny_policy, prefect_server):
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: build it here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    api_url = prefect_server[0].api_url
    small = ["--run-id", RUN, *_overrides(tiny_model_dir)]
    one_node = tmp_path_factory.mktemp("one_node")
    rc, output, _ = _ragen(["train", "--config", "configs/bandit.yaml", *small, *ONE_NODE], one_node, api_url)
    assert rc == 0, output[-3000:]
    two_nodes, node1 = tmp_path_factory.mktemp("two_nodes"), tmp_path_factory.mktemp("node1")
    port = free_port()
    join = _join(node1, port, fault="update:node@3")  # started before the run: it waits for node 0
    killed = _ragen([*_documented(port)["train"], *small], two_nodes, api_url)
    killed_join = _finish(join)
    killed_manifest = DataLake(two_nodes).read_manifest(RUN)
    killed_committed = DataLake(two_nodes).committed_iterations(RUN)
    port = free_port()  # a requeued job's node 0 may listen elsewhere: the endpoint is no part of the config
    join = _join(node1, port)
    resumed = _ragen(_documented(port)["resume"], two_nodes, api_url)
    return {
        "one_node": one_node,
        "two_nodes": two_nodes,
        "killed": killed,
        "killed_join": killed_join,
        "killed_manifest": killed_manifest,
        "killed_committed": killed_committed,
        "resumed": resumed,
        "resumed_join": _finish(join),
    }


def test_a_node_killed_mid_update_stops_the_run_in_one_line(runs):
    rc, output, _ = runs["killed"]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, output[-3000:]
    assert "the update group lost a rank during 'update'" in errors[0] and "127.0.0.1" in errors[0]
    assert "Traceback" not in output
    join_rc, join_output = runs["killed_join"]
    assert join_rc == -signal.SIGKILL, join_output[-2000:]  # the node died whole: its `ragen group join` too
    manifest = runs["killed_manifest"]
    assert manifest.status == "failed"
    assert runs["killed_committed"] == [0, 1, 2]  # iteration 3's update never finished
    group = manifest.update_group
    assert (group["nnodes"], group["nproc"], group["world_size"], len(group["hosts"])) == (2, 1, 2, 2)
    survivors = [pid for pid in [group["launcher_pid"], *group["worker_pids"]] if process_alive(pid, None)]
    assert survivors == [], f"processes of the failed run's update group still alive: {survivors}"


def test_the_run_resumes_with_the_node_joining_again(runs):
    rc, output, _ = runs["resumed"]
    assert rc == 0, output[-3000:]
    join_rc, join_output = runs["resumed_join"]
    assert join_rc == 0 and "the run stopped its update group; node 1 is done" in join_output, join_output[-2000:]
    manifest = DataLake(runs["two_nodes"]).read_manifest(RUN)
    assert manifest.status == "completed"
    attempt = manifest.resumes[-1]
    assert attempt["checkpoint_updates"] == 2 and attempt["replayed"] == [2]
    assert attempt["update_group"]["world_size"] == 2 and attempt["update_group"]["nnodes"] == 2


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_rows_equal_one_node_with_two_ranks(runs, table):
    expected, actual = _rows(runs["one_node"], table), _rows(runs["two_nodes"], table)
    assert len(actual) == len(set(actual)) == len(expected) > 0
    assert actual == expected


def test_final_weights_equal_one_node_with_two_ranks_bit_for_bit(runs):
    final = [
        load_file(root / "runs" / RUN / "checkpoints" / "iteration=4" / "hf" / "model.safetensors")
        for root in (runs["one_node"], runs["two_nodes"])
    ]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
    norms = [
        {(r["iteration"], r["name"]): r["value"] for r in DataLake(root).read_table("metrics", RUN).to_pylist()}
        for root in (runs["one_node"], runs["two_nodes"])
    ]
    grad = sorted(key for key in norms[0] if key[1].startswith("actor/grad_norm"))
    assert len(grad) == 8 and all(norms[0][key] == norms[1][key] for key in grad)  # the same ZeRO-2 reduction
