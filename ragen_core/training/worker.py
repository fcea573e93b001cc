"""A process of the launched update group: ``python -m ragen_core.training.worker --control-file FILE`` on the
run's host, ``... --join`` on another node of the group.

Started by ``torchrun`` or the ``deepspeed`` launcher (see :mod:`ragen_core.training.group`; on the other nodes by
``ragen group join``), never by hand. Rank 0 (on the run's host, the only rank that reads the control file)
connects to the run's process, every rank builds the engines on ``init``, then each command (``restore``,
``update``, ``save``, ``stop``) read by rank 0 is broadcast and executed by all ranks in lockstep:

- ``update``: the StarPO update on the iteration's published, kept rows read from the lake, then the new weights for
  the rollout side: copied into the shared-memory buffer rank 0 keeps (:mod:`ragen_core.rollout.handoff`), and
  written as a Hugging Face export only when the command asks (a vLLM rollout server reloads a folder);
- ``restore``: load a checkpoint and replay committed updates from their stored batches, then the export;
- ``save``: a checkpoint, laid out exactly as in one process.

Every rank runs the one-process updater (:class:`ragen_core.training.updater.InProcessUpdater`): the same code
updates, saves and restores in both modes.

Any exception ends the group (rank 0 reports it first); the run's process then fails the stage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_core.faults import ENV_VAR, fault_matches

WATCH_INTERVAL_S = 0.5
WATCH_ENDPOINT_S = 5.0  # a joined rank's look at node 0's endpoint
COLLECTIVE_TIMEOUT_S = 24 * 3600.0  # see main()


@dataclass
class _Worker:
    """One rank's state: its engines, behind the same updater a one-process run uses, and (rank 0) the shared
    buffer the new weights are handed over in."""

    rank: int = 0
    joined: bool = False  # a rank of another node (``ragen group join``), not of the run's host
    updater: Any = None  # ragen_core.training.updater.InProcessUpdater
    hands_off: bool = False  # every rank: whether updates end with a hand-off (a collective under ZeRO-3)
    shared: Any = None  # rank 0: ragen_core.rollout.handoff.SharedWeights


_SHARED_FILES: list[Path] = []  # removed if this process must exit because the run's process is gone


def _watch_parent(parent: dict[str, Any]) -> None:
    """Exit at once when the run's process is gone, even in the middle of an update (only on its host; elsewhere
    rank 0's end stops the group)."""
    from ragen_core.training.group import process_alive

    if parent.get("host") != socket.gethostname():
        return
    pid, start = int(parent["pid"]), parent.get("start")

    def watch() -> None:
        while process_alive(pid, start):
            time.sleep(WATCH_INTERVAL_S)
        for path in _SHARED_FILES:  # normally unlinked by the run's process already
            path.unlink(missing_ok=True)
        os._exit(3)  # no clean-up: the run that owned this group is gone

    threading.Thread(target=watch, name="ragen-parent-watch", daemon=True).start()


def _node_fault(iteration: int) -> None:
    """``RAGEN_FAULT=update:node@N`` on a joined node: the node dies in update N (its launcher, then this rank)."""
    if fault_matches(os.environ.get(ENV_VAR), "update", "node", iteration) and os.getppid() != 1:
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def _watch_endpoint(host: str, port: int, interval: float = WATCH_ENDPOINT_S, misses: int = 3) -> None:
    """On a joined node: exit when node 0's rendezvous endpoint stops answering ``misses`` times in a row (node 0's
    launcher is gone with its run), so a rank waiting in a collective that would block until the group's timeout
    (NCCL's) releases its node at once."""

    def watch() -> None:
        missed = 0
        while missed < misses:
            time.sleep(interval)
            try:
                socket.create_connection((host, port), timeout=interval).close()
                missed = 0
            except OSError:
                missed += 1
        print(f"error: node 0's endpoint {host}:{port} is gone (its run ended): this rank exits", file=sys.stderr)
        os._exit(3)

    threading.Thread(target=watch, name="ragen-node0-watch", daemon=True).start()


def _check_world() -> str | None:
    """Why this group cannot run (every node must hold as many ranks: torchrun numbers a node's ranks after the
    ranks of the nodes before it); None when it can. From torchrun's variables, before any collective."""
    world, nodes, local = (int(os.environ.get(k, "0")) for k in ("WORLD_SIZE", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    if nodes and local and world != nodes * local:
        return (
            f"the group's {nodes} nodes hold {world} ranks, this one {local}: give every `ragen group join` --nproc "
            "equal to the run's trainer.nproc"
        )
    return None


def _init(worker: _Worker, command: dict[str, Any]) -> dict[str, Any]:
    """Build this rank's engines (as a one-process run does); with ``shared_weights``, rank 0 also creates the
    shared buffer of the policy's weights (its file and layout go back in the reply). The reply says the threads
    this rank computes with."""
    import torch

    from ragen_core.config import build_config
    from ragen_core.rollout.handoff import SharedWeights, WeightLayout
    from ragen_core.storage import DataLake
    from ragen_core.training.engines import set_determinism
    from ragen_core.training.updater import InProcessUpdater

    config = build_config(command["config"])
    set_determinism(config)
    lake = DataLake(command["data_root"])
    worker.updater = InProcessUpdater.start(
        config, lake, command["run_id"], Path(command["model_dir"]), command["precision"]
    )
    reply: dict[str, Any] = {"device": str(worker.updater.actor.device), "threads": thread_settings(torch)}
    worker.hands_off = bool(command.get("shared_weights"))
    if worker.hands_off and worker.rank == 0:
        try:
            worker.shared = SharedWeights.create(WeightLayout.of_module(worker.updater.actor.module))
        except OSError as exc:  # no room: the run's process then asks for an export after every update
            print(f"no shared-memory weight hand-off ({exc}); exporting after every update", file=sys.stderr)
        else:
            _SHARED_FILES.append(worker.shared.path)
            reply["shared_weights"] = {"path": str(worker.shared.path), "layout": worker.shared.layout.to_json()}
    return reply


def thread_settings(torch: Any) -> dict[str, Any]:
    """What this process computes with on the CPU: torch's intra- and inter-op threads and the OpenMP variables."""
    names = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")
    return {
        "intra_op": torch.get_num_threads(),
        "inter_op": torch.get_num_interop_threads(),
        **{name: os.environ.get(name) for name in names},
    }


def _update(worker: _Worker, command: dict[str, Any]) -> dict[str, Any]:
    """The update, then the new weights into the shared buffer (every rank takes part: ZeRO-3 gathers them) and,
    when asked, a Hugging Face export. The reply carries the two times (``timing``) for the benchmarks."""
    started = time.perf_counter()
    if worker.joined:
        _node_fault(int(command["iteration"]))
    metrics = worker.updater.update(int(command["iteration"]))
    updated = time.perf_counter()
    if worker.hands_off:
        parameters = full_parameters(worker.updater.actor)
        if worker.shared is not None and parameters is not None:
            worker.shared.write(parameters)
    weights = str(worker.updater.export()) if command["export"] else None
    timing = {"update_s": updated - started, "handoff_s": time.perf_counter() - updated}
    return {"metrics": metrics, "weights": weights, "shared": worker.hands_off, "timing": timing}


def _execute(worker: _Worker, command: dict[str, Any]) -> dict[str, Any]:
    """Run one command on this rank; the reply rank 0 sends back. ``update`` hands the new weights over in shared
    memory (and, when asked, a Hugging Face export); ``restore`` ends with an export, which the run's process loads
    into its rollout copy."""
    op, updater = command["op"], worker.updater
    if op == "init":
        return _init(worker, command)
    if op == "update":
        return _update(worker, command)
    if op == "restore":
        checkpoint = Path(command["checkpoint"]) if command["checkpoint"] else None
        updater.restore(checkpoint, [int(i) for i in command["replay"]])
        return {"weights": str(updater.export())}
    if op == "save":
        return {"path": str(updater.save(int(command["updates"]), command["extra"]))}
    raise ValueError(f"unknown command {op!r}")


def full_parameters(actor: Any) -> dict[str, Any] | None:
    """The actor's whole parameters by name (a LoRA actor's trainable ones: its adapters), on rank 0 (None on the
    others). Every rank must call it: under ZeRO-3 the partitioned weights are gathered (a collective; a LoRA
    actor's frozen base is left out); otherwise they are the module's own tensors."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if actor.engine.zero_optimization_partition_weights():  # DeepSpeed's gather, complete on rank 0
        state = actor.engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=actor.adapter)
        return dict(state) if rank == 0 else None
    return dict(actor.module.named_parameters()) if rank == 0 else None


class _Channel:
    """Rank 0's line-based JSON connection to the run's process."""

    def __init__(self, address: list[Any], hello: dict[str, Any]) -> None:
        self.socket = socket.create_connection((str(address[0]), int(address[1])))
        self.reader = self.socket.makefile("r", encoding="utf-8")
        self.send(hello)

    def send(self, message: dict[str, Any]) -> None:
        self.socket.sendall((json.dumps(message) + "\n").encode())

    def receive(self) -> dict[str, Any]:
        line = self.reader.readline()
        return json.loads(line) if line else {"op": "stop"}  # the run's process closed the connection: stop


def _serve(worker: _Worker, channel: _Channel | None, dist: Any) -> None:
    """Take each command from rank 0 (broadcast) and run it in lockstep until ``stop``. Any failure, the broadcast
    included (a rank of another node that died between two commands), ends this process: rank 0 first reports it,
    saying whether the group lost a rank (:func:`lost_peer`)."""
    while True:
        try:
            box = [channel.receive() if channel else None]
            dist.broadcast_object_list(box, src=0)
            command = box[0]
            if command["op"] == "stop":
                return
            reply = {"ok": True, **_execute(worker, command)}
        except Exception as exc:  # noqa: BLE001  (any failure ends the group; rank 0 reports it first)
            error = f"rank {worker.rank}: {traceback.format_exc()}"
            print(error, file=sys.stderr, flush=True)
            if channel:
                channel.send({"ok": False, "error": error, "lost": lost_peer(exc)})
            os._exit(1)
        if channel:
            channel.send(reply)


# What the collective backends raise when the other end of a connection is gone (gloo: "Read error [ADDR]:PORT:
# Connection reset by peer", "Connection closed by peer [ADDR]:PORT", a broken pipe; NCCL: "a network error or a
# remote process exiting prematurely"). A timeout is not one: a rank that is slow or stuck is another failure.
_LOST = re.compile(r"connection (?:reset|closed) by peer|broken pipe|remote process exit|network error", re.IGNORECASE)
_PEER = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+")


def lost_peer(exc: BaseException) -> str | None:
    """When ``exc`` says that a collective lost its connection to another rank: that rank's address where the
    backend names it (else "another rank"); None for any other failure."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not _LOST.search(text):
        return None
    peer = _PEER.search(text)
    return peer.group(1) if peer else "another rank"


def main(argv: list[str] | None = None) -> int:
    """Join the group, then serve commands until ``stop`` (or the run's process is gone)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--control-file", help="JSON file with the control address and token (the run's host)")
    where.add_argument("--join", action="store_true", help="a rank of another node: every command comes from rank 0")
    args = parser.parse_args(argv)
    control = json.loads(Path(args.control_file).read_text()) if args.control_file else None
    if control is not None:
        _watch_parent(control["parent"])
    elif os.environ.get("RANK") == "0":
        print("rank 0 runs on the run's own host (node 0): join other nodes with --node-rank >= 1", file=sys.stderr)
        return 2
    else:
        _watch_endpoint(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    mismatch = _check_world()
    if mismatch:
        print(f"error: {mismatch}", file=sys.stderr)
        return 2

    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cuda":
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # ranks wait for the next command inside a broadcast for as long as the rollouts between two updates take: the
    # group's timeout must outlast them (DeepSpeed's default, 10 minutes, would end a group with longer rollouts); a
    # dead rank is noticed by its connection's end, node 0's death by the watchers
    deepspeed.init_distributed(timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    identity = [None] * world
    dist.all_gather_object(identity, (os.getpid(), socket.gethostname()))
    channel = None
    if rank == 0:
        hello = {
            "token": control["token"],
            "world_size": world,
            "pids": [i[0] for i in identity],
            "hosts": [i[1] for i in identity],
        }
        channel = _Channel(control["address"], hello)
    _serve(_Worker(rank=rank, joined=control is None), channel, dist)
    for path in _SHARED_FILES:
        path.unlink(missing_ok=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
