"""The update group on two nodes against one node with as many ranks: the same update on the same batch, side by side.

    python -m benchmarks.nodes_bench [--shape 20m] [--repeats 3] [--threads 1]

One node: a group of two ranks started by ``torchrun`` (``trainer.nproc=2``). Two nodes: one rank started by the
run's process as node 0 (``trainer.nnodes=2``, ``trainer.rdzv_endpoint``), the other joined by ``ragen group join``
from a working folder of its own, as another host runs it (docs/cluster.md). Both groups run ZeRO-2, are up at once
and take turns (interleaved) updating on the same stored batch (configs/bandit.yaml's); each update ends with the new
weights in this process's rollout copy. ``nodes_update_ratio`` is the two-node time over the one-node time, per
repeat. Both sides update the same weights on the same batch in the same order, so their rollout copies must end
equal bit for bit (``same_weights``): the ranks are the same, only the way they met differs.

On one machine the two nodes talk over loopback, as the one node's ranks do: the ratio measures what joining costs
(the rendezvous, a rank in another process tree), not a network. Across hosts the gradients' all-reduce crosses the
network: add its time (the gradient bytes over the link's bandwidth) to the two-node side.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import interleave, shape_bench_main, spread
from benchmarks.group_bench import RolloutCopy


@dataclass(frozen=True)
class NodesCase:
    """One side-by-side measurement: a model shape, the repeats and the torch threads of every rank."""

    shape: str
    repeats: int
    threads: int


def _join(endpoint: str, folder: Path) -> subprocess.Popen:
    """`ragen group join ENDPOINT --nnodes 2 --node-rank 1 --nproc 1` from ``folder``, in a session of its own."""
    script = Path(sys.executable).with_name("ragen")
    command = [str(script), "group", "join", endpoint, "--nnodes", "2", "--node-rank", "1", "--nproc", "1"]
    with open(folder / "join.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def measure(case: NodesCase) -> dict[str, Any]:
    """Interleaved repeats of the one-node and the two-node group's update (each with its hand-off into a rollout
    copy of this process) on one stored batch; the per-repeat ratio, both sides' seconds and whether the two copies
    end bitwise equal."""
    from benchmarks.models import model_dir, parameter_count
    from benchmarks.update_bench import UpdateCase, bench_config, make_batch
    from ragen_core.run.checks import build_run_config
    from ragen_core.run.session import open_session
    from ragen_core.storage import DataLake
    from ragen_core.training.distributed import free_port
    from ragen_core.training.updater import LaunchedUpdater

    folder = model_dir(case.shape)
    config = bench_config(UpdateCase(case.shape, folder, case.repeats, case.threads))
    launched = ["trainer.launcher=torchrun", "actor.zero_stage=2"]
    endpoint = f"127.0.0.1:{free_port()}"
    sides = {
        "one_node": build_run_config(config.to_dict(), [*launched, "trainer.nproc=2"]),
        "two_nodes": build_run_config(
            config.to_dict(), [*launched, "trainer.nproc=1", "trainer.nnodes=2", f"trainer.rdzv_endpoint={endpoint}"]
        ),
    }
    with tempfile.TemporaryDirectory(prefix="nodes-bench-") as root:
        lake, node1 = DataLake(Path(root) / "data"), Path(root) / "node1"
        node1.mkdir()
        session = open_session(config, lake, f"nodes-bench-{case.shape}", folder)
        groups: dict[str, Any] = {}
        join = None
        try:
            make_batch(session, 0)
            groups["one_node"] = LaunchedUpdater.start(sides["one_node"], lake, session.run_id, folder, "fp32")
            join = _join(endpoint, node1)
            groups["two_nodes"] = LaunchedUpdater.start(sides["two_nodes"], lake, session.run_id, folder, "fp32")
            copies = {
                name: RolloutCopy(group.rollout_policy(folder, torch.float32)[0]) for name, group in groups.items()
            }

            def side(name: str):
                def update() -> int:
                    tokens = int(groups[name].update(0)["actor/trained_tokens"])
                    groups[name].sync(copies[name])
                    return tokens

                return update

            for name in groups:  # warm-up: first-step allocations, optimizer state
                side(name)()
            timings = interleave({name: side(name) for name in groups}, case.repeats)
            one, two = (dict(copies[name].model.named_parameters()) for name in ("one_node", "two_nodes"))
            same = one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
            hosts = {name: group.group.hosts for name, group in groups.items()}
            parameters = parameter_count(copies["one_node"].model)
        finally:
            for group in groups.values():
                group.close()
            if join is not None:
                try:
                    join.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(join.pid, signal.SIGKILL)
    return summarise(case, timings, same, hosts, parameters)


def summarise(
    case: NodesCase, timings: dict[str, list[tuple[float, int]]], same: bool, hosts: dict[str, Any], parameters: int
) -> dict[str, Any]:
    """Per-repeat ratio (two nodes / one node), both sides' seconds, the tokens each update trained on."""
    seconds = {side: [s for s, _ in runs] for side, runs in timings.items()}
    tokens = {result for runs in timings.values() for _, result in runs}
    return {
        "shape": case.shape,
        "parameters": parameters,
        "repeats": case.repeats,
        "threads": case.threads,
        "same_tokens": len(tokens) == 1,
        "trained_tokens": next(iter(tokens)),
        "same_weights": same,
        "hosts": hosts,
        "seconds": {side: spread(values) for side, values in seconds.items()},
        "ratio": spread([t / o for t, o in zip(seconds["two_nodes"], seconds["one_node"], strict=True)]),
        "raw_seconds": seconds,
    }


def main() -> None:
    shape_bench_main(
        __doc__,
        lambda shape, repeats, threads: measure(NodesCase(shape, repeats, threads)),
        "torch threads of every rank.",
    )


if __name__ == "__main__":
    main()
