"""The update group's other nodes (``trainer.nnodes`` > 1): ``ragen group join`` on each of them.

The run's host is node 0: its launcher (:mod:`ragen_core.training.group`) listens at ``trainer.rdzv_endpoint`` and
starts its ``trainer.nproc`` ranks, rank 0 among them. Every other node runs ``ragen group join ENDPOINT --nnodes N
--node-rank R --nproc P``: a ``torchrun`` of its own, node R of torchrun's static rendezvous, so its ranks are the
global ranks R*P .. R*P+P-1 on every start and the update equals one node's with as many ranks. Its ranks take every
command from rank 0; they read no control file and hold no token (:mod:`ragen_core.training.worker`, ``--join``).

The join's launcher runs in a session of its own with this process's death signal, so only the signals this
process passes on reach it (a terminal's Ctrl-C once, a scheduler's SIGTERM), and it ends with this process. Its
output and its ranks' go to a log file, kept and named when the node ends otherwise than by the run's stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_core.config.optimisation import rendezvous_address
from ragen_core.training.group import _last_error, end_launcher, group_environment, torchrun_command

JOIN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 10.0  # how long a launcher has to stop after a passed-on signal before it is killed


def check_join(endpoint: str, nnodes: int, node_rank: int, nproc: int) -> tuple[str, int]:
    """ValueError in one line unless a node can join as asked (before anything starts); the endpoint's host and
    port otherwise."""
    if nnodes < 2:
        raise ValueError(f"--nnodes {nnodes}: a group with a joining node has at least 2 (the run's trainer.nnodes)")
    if not 0 < node_rank < nnodes:
        raise ValueError(
            f"node rank {node_rank} is not one of the joining nodes 1..{nnodes - 1}: node 0 is the run's own host "
            f"(give each other node its own rank 1..{nnodes - 1}, e.g. $((SLURM_PROCID + 1)) in an srun over them)"
        )
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1 (the run's trainer.nproc), not {nproc}")
    return rendezvous_address(endpoint)


def join_command(endpoint: str, nnodes: int, node_rank: int, nproc: int, log_dir: Path) -> list[str]:
    """The torchrun command line that adds this host's ``nproc`` ranks to a run's update group as node
    ``node_rank`` (1 .. nnodes-1) of the group whose node 0 listens at ``endpoint``."""
    master = check_join(endpoint, nnodes, node_rank, nproc)
    return torchrun_command(nproc, nnodes, node_rank, master, log_dir, ["--join"])


@dataclass(frozen=True)
class NodeEnd:
    """How a joined node ended: the launcher's exit code, the signal this process passed on to it (None: none
    came), and its log file (None: removed, the run stopped the group)."""

    code: int
    signal: int | None
    log: Path | None


def run_node(endpoint: str, nnodes: int, node_rank: int, nproc: int) -> NodeEnd:
    """Join this host's ``nproc`` ranks to a run's update group as node ``node_rank`` and serve it until the run
    stops the group (its session ends: code 0, the log removed), the group fails, or a signal stops this process
    (SIGINT, SIGTERM, SIGHUP: passed on to the launcher, which stops its ranks)."""
    folder = Path(tempfile.mkdtemp(prefix="ragen-node-"))
    log = folder / "node.log"
    command = join_command(endpoint, nnodes, node_rank, nproc, folder / "torchelastic")
    env = group_environment()
    if "RAGEN_FAULT" in os.environ:  # a fault injected into this node's own command is meant for its ranks
        env["RAGEN_FAULT"] = os.environ["RAGEN_FAULT"]
    received: list[int] = []
    process: subprocess.Popen | None = None

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if process is not None:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in JOIN_SIGNALS}  # before the launcher exists: no gap
    try:
        with open(log, "wb") as output:
            process = subprocess.Popen(
                command,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            if received:  # a signal that came while it started
                process.send_signal(received[0])
            code = _wait(process, received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if process is not None:
            end_launcher(process)
    if code == 0 and not received:
        shutil.rmtree(folder, ignore_errors=True)
        return NodeEnd(0, None, None)
    return NodeEnd(code, received[0] if received else None, log)


def _wait(process: subprocess.Popen, received: list[int]) -> int:
    """The launcher's exit code; once a signal was passed on, the launcher is killed if it has not exited within
    :data:`STOP_GRACE_S` (torchrun waiting at the rendezvous is in a call that runs no signal handler until the wait
    ends, 600 s later; its ranks, once started, it stops on the signal itself)."""
    deadline = None
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if received and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                process.kill()


def _die_with_parent() -> None:
    """In the launcher, before it runs: the kernel sends it SIGTERM when this process dies (Linux's
    PR_SET_PDEATHSIG), so a SIGKILLed ``ragen group join`` leaves no launcher behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the group's end still ends the launcher


def last_error(log: Path | None) -> str:
    """What a node's log says failed: a rank's ``error:`` line (the group's own reading of it), else the last line."""
    if log is None:
        return ""
    reason = _last_error(log)
    if reason:
        return reason
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""
