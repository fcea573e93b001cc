"""The update stage in a launched group (trainer.launcher=torchrun, 2 processes, gloo, ZeRO-2): the run completes,
resumes after a SIGKILL without leaving orphan processes, and its rows match the in-process run's.

Why exact rows: with 2 ranks and micro_batch_size = mini_batch_size / 2, each rank runs exactly one micro-batch per
optimizer step, so the reduced gradient is g0 + g1 (times 2 for DeepSpeed's average, then halved: exact in binary),
the same sum the one-process run accumulates. The weights after every update are therefore bitwise equal, and so
are the sampled rollouts. Only the logged gradient norm differs in the last bits (DeepSpeed's ZeRO computes it over
the flat partitions; one process sums per-tensor norms): compared to 1e-5 relative. ``config_hash`` differs by
construction (the launcher is part of the config).

The same group on two nodes (issue 70, item 2): node 0 is the run's own host, node 1 joins with `ragen group join`
from a working folder of its own, as another host would (torchrun's static rendezvous on loopback), both by
docs/cluster.md's own commands. Node r holds the global ranks r*nproc .. r*nproc+nproc-1, so two nodes of one rank
each are the one-node group of two ranks above: the same shards, the same reduction. The two-node run is killed where
it hurts most, inside iteration 3's update by the death of node 1 (its launcher and its rank, SIGKILL), and resumed
with node 1 joining again; its rows, gradient norms and final weights equal the one-node run's bit for bit.
"""

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake
from ragen_core.training.distributed import free_port
from ragen_core.training.group import process_alive

pytestmark = pytest.mark.slow  # six CLI runs starting a 2-process group, one refused (about 4 minutes)
RUN = "l"
DISTRIBUTED = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PREFECT_HOME",
    "PREFECT_API_URL",
    "RAGEN_FAULT",
}
LAUNCHED = ["trainer.launcher=torchrun", "trainer.nproc=2", "actor.zero_stage=2"]
NOT_COMPARED = {"created_at", "updated_at", "config_hash"}
LAST_BITS = ("actor/grad_norm", "actor/grad_norm_max")  # computed differently by ZeRO (see the module docstring)
CLUSTER = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def _overrides(model_dir):
    return [
        f"model.path={model_dir}",
        "seed=5",
        "env.val_envs=[bandit]",
        "rollout.env_groups=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=2",
        "algorithm.filter_ratio=1.0",
        "trainer.iterations=4",
        "trainer.num_threads=1",
        "trainer.checkpoint_every=2",
        "eval.every=2",
        "eval.instances=2",
        "bootstrap.enabled=false",
    ]


def _ragen(args, root, api_url, fault=None):
    """Run the CLI in its own process group, talking to the Prefect server at ``api_url`` (the session's: no
    temporary server per process). After a fault kill, wait (up to 30 s) for the update group recorded in the
    manifest to exit on its own; only then kill whatever is left.
    Returns (exit code, output, pids of the update group still alive after the wait)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env["PREFECT_API_URL"] = api_url
    if fault:
        env["RAGEN_FAULT"] = fault
    script = str(Path(sys.executable).with_name("ragen"))
    log = Path(root) / f".log-{len(list(Path(root).glob('.log-*')))}.txt"
    survivors: list[int] = []
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [script, *args, "--data-root", str(root)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            process.wait(timeout=400)
            manifest = DataLake(root).read_manifest(RUN)
            group = (manifest.update_group if manifest is not None else None) or {}
            pids = [group.get("launcher_pid"), *group.get("worker_pids", [])] if fault else []
            deadline = time.monotonic() + 30
            while any(process_alive(p, None) for p in pids if p) and time.monotonic() < deadline:
                time.sleep(0.2)
            survivors = [p for p in pids if p and process_alive(p, None)]
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return process.returncode, log.read_text(), survivors


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tiny_policy, prefect_server):
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: build it here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    inprocess = tmp_path_factory.mktemp("inprocess")
    api_url = prefect_server[0].api_url
    rc, output, _ = _ragen(train, inprocess, api_url)
    assert rc == 0, output[-3000:]
    launched = tmp_path_factory.mktemp("launched")
    # killed inside iteration 3's update: the group has stepped, nothing is saved; the checkpoint after update 2
    # is loaded (both ranks' ZeRO-2 shards) on resume and the batch of iteration 3 is trained on again
    rc, output, survivors = _ragen([*train, *LAUNCHED], launched, api_url, fault="update:inside@3")
    assert rc == -signal.SIGKILL, output[-3000:]
    manifest = DataLake(launched).read_manifest(RUN)
    # the manifest's launcher is used only when the user names it again (a stored config never starts processes)
    rc, resumed, _ = _ragen(["resume", RUN, "trainer.launcher=torchrun"], launched, api_url)
    assert rc == 0, resumed[-3000:]
    return inprocess, launched, survivors, manifest


def test_the_group_dies_with_the_run_and_the_run_resumes(runs):
    _, launched, survivors, killed_manifest = runs
    group = killed_manifest.update_group
    assert (group["launcher"], group["nproc"], group["world_size"], len(group["worker_pids"])) == ("torchrun", 2, 2, 2)
    assert survivors == [], f"processes of the killed run's update group still alive: {survivors}"
    manifest = DataLake(launched).read_manifest(RUN)
    assert manifest.status == "completed" and manifest.precision == "fp32"
    assert DataLake(launched).committed_iterations(RUN) == [0, 1, 2, 3, 4]
    attempt = manifest.resumes[-1]
    assert attempt["checkpoint_updates"] == 2 and attempt["replayed"] == [2]
    assert attempt["update_group"]["world_size"] == 2 and attempt["precision"] == "fp32"


def _rows(root, table):
    rows = DataLake(root).read_table(table, RUN).to_pylist()
    if table == "metrics":
        rows = [r for r in rows if not r["name"].startswith(("time/", "perf/")) and r["name"] not in LAST_BITS]
    return sorted(repr(sorted((k, v) for k, v in r.items() if k not in NOT_COMPARED)) for r in rows)


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_rows_match_the_in_process_run(runs, table):
    inprocess, launched, _, _ = runs
    expected, actual = _rows(inprocess, table), _rows(launched, table)
    assert len(actual) == len(set(actual)) == len(expected) > 0
    assert actual == expected


def test_gradient_norms_and_final_weights_match(runs):
    inprocess, launched, _, _ = runs
    norms = {}
    for root in (inprocess, launched):
        rows = DataLake(root).read_table("metrics", RUN).to_pylist()
        norms[root] = {(r["iteration"], r["name"]): r["value"] for r in rows if r["name"] in LAST_BITS}
    assert len(norms[inprocess]) == 8 and norms[inprocess].keys() == norms[launched].keys()
    for key, value in norms[inprocess].items():
        assert norms[launched][key] == pytest.approx(value, rel=1e-5), key
    final = [
        load_file(root / "runs" / RUN / "checkpoints" / "iteration=4" / "hf" / "model.safetensors")
        for root in (inprocess, launched)
    ]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])


# -- two nodes ---------------------------------------------------------------------------------------------------
def _documented(port):
    """docs/cluster.md's commands for two nodes, as the test runs them on loopback: the blocks of "The update on
    several nodes" (the first: start and join; the second: resume and join again), node0 -> 127.0.0.1, its port ->
    ``port``, ``<run id>`` -> the test's run. Returns {"train": args, "group": args, "resume": args} (no "ragen");
    both blocks' join lines must be the same line."""
    section = CLUSTER.read_text().split("## The update on several nodes", 1)[1]
    blocks = [block.split("```", 1)[0] for block in section.split("```bash")[1:3]]
    lines = []
    for block in blocks:
        block = block.replace("node0:29400", f"127.0.0.1:{port}").replace("<run id>", RUN)
        lines += [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("ragen ")]
    commands = {line[0]: line for line in lines}
    assert len(lines) == 4 and set(commands) == {"train", "group", "resume"}, lines
    assert [line for line in lines if line[0] == "group"] == [commands["group"]] * 2, lines
    return commands


def _join(folder, port, fault=None, nproc=None):
    """docs/cluster.md's `ragen group join` as the other host runs it (``nproc``: another --nproc than the run's):
    its own working folder, its own session (never the test's)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    if fault:
        env["RAGEN_FAULT"] = fault
    folder.mkdir(exist_ok=True)
    args = _documented(port)["group"]
    if nproc is not None:
        args[args.index("--nproc") + 1] = nproc
    log = open(folder / f"join-{port}.log", "w")  # noqa: SIM115 (closed by _finish)
    command = [str(Path(sys.executable).with_name("ragen")), *args]
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
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
def nodes(runs, tmp_path_factory, tiny_model_dir, prefect_server):
    """The two-node run (after ``runs``: DeepSpeed's CPU op is built), killed with its node 1, then resumed; and
    ``runs``' launched run, one node of two ranks, to compare it with."""
    api_url = prefect_server[0].api_url
    small = ["--run-id", RUN, *_overrides(tiny_model_dir)]
    two_nodes, node1 = tmp_path_factory.mktemp("two_nodes"), tmp_path_factory.mktemp("node1")
    port = free_port()
    join = _join(node1, port, fault="update:node@3")  # started before the run: it waits for node 0
    killed = _ragen([*_documented(port)["train"], *small], two_nodes, api_url)
    killed_join = _finish(join)
    killed_manifest = DataLake(two_nodes).read_manifest(RUN)
    killed_committed = DataLake(two_nodes).committed_iterations(RUN)
    port = free_port()  # a requeued job's node 0 may listen elsewhere: the endpoint is no part of the config
    joins = []  # node 0 first this time: node 1 joins once the resume has started
    later = threading.Timer(5.0, lambda: joins.append(_join(node1, port)))
    later.start()
    resumed = _ragen(_documented(port)["resume"], two_nodes, api_url)
    later.join()
    return {
        "one_node": runs[1],
        "two_nodes": two_nodes,
        "killed": killed,
        "killed_join": killed_join,
        "killed_manifest": killed_manifest,
        "killed_committed": killed_committed,
        "resumed": resumed,
        "resumed_join": _finish(joins[0]),
    }


def test_a_node_killed_mid_update_stops_the_run_in_one_line(nodes):
    rc, output, _ = nodes["killed"]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, output[-3000:]
    assert errors[0].startswith("error: the update group on 2 nodes ended: a rank's connection to 127.0.0.1 broke")
    assert "Start `ragen group join` again on every other node" in errors[0] and "Traceback" not in output
    join_rc, join_output = nodes["killed_join"]  # its launcher and its rank died: `ragen group join` says so
    errors = [line for line in join_output.splitlines() if line.startswith("error:")]
    assert join_rc == 2 and len(errors) == 1 and "Traceback" not in join_output, join_output[-2000:]
    assert errors[0].startswith(f"error: node 1's ranks ended with exit code {-signal.SIGKILL}")
    assert Path(errors[0].split("its log: ", 1)[1].split(". ", 1)[0]).is_file()  # kept, named
    manifest = nodes["killed_manifest"]
    assert manifest.status == "failed"
    assert nodes["killed_committed"] == [0, 1, 2]  # iteration 3's update never finished
    group = manifest.update_group
    assert (group["nnodes"], group["nproc"], group["world_size"], len(group["hosts"])) == (2, 1, 2, 2)
    survivors = [pid for pid in [group["launcher_pid"], *group["worker_pids"]] if process_alive(pid, None)]
    assert survivors == [], f"processes of the failed run's update group still alive: {survivors}"


def test_the_run_resumes_with_the_node_joining_again(nodes):
    rc, output, _ = nodes["resumed"]
    assert rc == 0, output[-3000:]
    join_rc, join_output = nodes["resumed_join"]
    assert join_rc == 0 and "the run stopped its update group; node 1 is done" in join_output, join_output[-2000:]
    assert "Traceback" not in join_output and "error" not in join_output  # the ranks' output is in its log
    manifest = DataLake(nodes["two_nodes"]).read_manifest(RUN)
    assert manifest.status == "completed"
    attempt = manifest.resumes[-1]
    assert attempt["checkpoint_updates"] == 2 and attempt["replayed"] == [2]
    assert attempt["update_group"]["world_size"] == 2 and attempt["update_group"]["nnodes"] == 2


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_rows_equal_one_node_with_two_ranks(nodes, table):
    expected, actual = _rows(nodes["one_node"], table), _rows(nodes["two_nodes"], table)
    assert len(actual) == len(set(actual)) == len(expected) > 0
    assert actual == expected


def test_final_weights_equal_one_node_with_two_ranks_bit_for_bit(nodes):
    final = [
        load_file(root / "runs" / RUN / "checkpoints" / "iteration=4" / "hf" / "model.safetensors")
        for root in (nodes["one_node"], nodes["two_nodes"])
    ]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
    norms = [
        {(r["iteration"], r["name"]): r["value"] for r in DataLake(root).read_table("metrics", RUN).to_pylist()}
        for root in (nodes["one_node"], nodes["two_nodes"])
    ]
    grad = sorted(key for key in norms[0] if key[1].startswith("actor/grad_norm"))
    assert len(grad) == 8 and all(norms[0][key] == norms[1][key] for key in grad)  # the same ZeRO-2 reduction


def test_a_node_with_other_ranks_than_the_run_is_refused_in_one_line(tmp_path, tiny_model_dir, prefect_server):
    """Node 0 with 1 rank and a node joining with 2 would make 3 ranks, numbered after one another: every rank
    refuses the group before any collective, and both commands say why in one line."""
    port = free_port()
    join = _join(tmp_path / "node1", port, nproc="2")  # the documented join with another --nproc than the run's
    train = [*_documented(port)["train"], "--run-id", RUN, *_overrides(tiny_model_dir)]
    (tmp_path / "root").mkdir()
    rc, output, _ = _ragen(train, tmp_path / "root", prefect_server[0].api_url)
    join_rc, join_output = _finish(join)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert "did not come up at 127.0.0.1:" in errors[0] and "the group's 2 nodes hold 3 ranks, this one 1" in errors[0]
    errors = [line for line in join_output.splitlines() if line.startswith("error:")]
    assert join_rc == 2 and len(errors) == 1 and "the group's 2 nodes hold 3 ranks, this one 2" in errors[0]
