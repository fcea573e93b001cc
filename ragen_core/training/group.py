"""The update stage in a launched group of processes (``trainer.launcher: torchrun | deepspeed``).

The run's process (the Prefect flow) keeps the rollout side; the update stage is handed to a long-lived group of
``trainer.nproc`` processes per node, started once per session by ``torchrun`` or the ``deepspeed`` launcher running
:mod:`ragen_core.training.worker`. The stage boundary is the lake: a command names the iteration (the
group reads that iteration's published, kept batch from the lake) and, on a restore, the checkpoint to start from;
the group answers with the metrics, writes checkpoints exactly as :mod:`ragen_core.training.checkpoint` lays them
out, and after every update hands the new weights to the rollout side in a shared-memory buffer
(:mod:`ragen_core.rollout.handoff`; a Hugging Face export only on a restore, at checkpoints, or when asked).

Control channel: this process listens on 127.0.0.1 (an OS-chosen port); rank 0 connects, proves it knows a random
token (handed over in a 0600 file under the run folder, never on a command line), then reads one JSON command per
line and broadcasts it to the other ranks. The group's life is tied to this process: rank 0 stops the group when
the connection closes, and every worker on this host exits within a second of this process's death (it watches
this process's pid and start time), so a SIGKILL of the run leaves no orphans. Any failure inside the group ends
the group; this side then raises :class:`GroupError` with the end of the group's log.

Several nodes (``trainer.nnodes`` > 1, torchrun): this host is node 0, its launcher listens at
``trainer.rdzv_endpoint`` and the other nodes join there (:mod:`ragen_core.training.nodes`); rank 0 connects once
every rank is up. A group on several nodes that does not come up, or that ends during a command, is a
:class:`GroupNodeError`: one line saying what and how to go on.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_core.config.optimisation import rendezvous_address
from ragen_core.training import worker as worker_entry

LOG = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # a first DeepSpeed start may compile its CPU ops (about a minute each on 2 cores)
STOP_TIMEOUT_S = 60.0
# torchrun's log folder (per start: <rendezvous id>_*/attempt_0/<rank>/, a failed rank's error.json), in the run's
# group folder: without --log-dir torchrun makes a <TMPDIR>/torchelastic_* of its own per start and never removes it
TORCHRUN_LOGS = "torchelastic"
WORKER_MODULE = worker_entry.__name__  # the group's processes run it (an import the layer checks see)
# Variables of this process's own one-process DeepSpeed world, or of a fault injection meant for this process; the
# launcher sets the group's own rank variables.
_NOT_INHERITED = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RAGEN_FAULT",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
)


class GroupError(RuntimeError):
    """The update group failed to start, failed a command or died; the message holds the end of its log."""


class GroupNodeError(GroupError):
    """A group on several nodes did not come up (a node did not join, or joined with other ranks) or ended during a
    command (a node died or lost the network): a one-line message that says what and how to go on; the ranks'
    tracebacks are in the group's log."""


RESUME_HINT = "resume the run naming trainer.launcher and trainer.rdzv_endpoint again: it continues bitwise"


@dataclass(frozen=True)
class Span:
    """Where a group's ranks run: ``nnodes`` nodes of ``nproc`` ranks, the other nodes joining at ``endpoint``."""

    nnodes: int = 1
    nproc: int = 1
    endpoint: str | None = None

    def hint(self) -> str:
        """The command line each other node runs to join (for the run's messages)."""
        rank = f"<1..{self.nnodes - 1}>"
        return f"ragen group join {self.endpoint} --nnodes {self.nnodes} --node-rank {rank} --nproc {self.nproc}"

    def not_up(self, log: Path, reason: str) -> GroupNodeError:
        return GroupNodeError(
            f"the update group on {self.nnodes} nodes did not come up at {self.endpoint}: {reason}. On each other "
            f"node run `{self.hint()}` (each with its own node rank; they wait 600 s for one another); log: {log}"
        )

    def ended(self, log: Path, what: str) -> GroupNodeError:
        return GroupNodeError(
            f"the update group on {self.nnodes} nodes ended: {what}, so a node died, lost the network or failed "
            f"(log: {log}). Start `ragen group join` again on every other node, then {RESUME_HINT}"
        )


def launch_command(
    launcher: str,
    nproc: int,
    master_port: int,
    control_file: Path,
    hostfile: str | None,
    nnodes: int = 1,
    master_addr: str = "127.0.0.1",
) -> list[str]:
    """The command line that starts the group (``python -m`` the launcher, so the run's interpreter is used); its
    files beside ``control_file``, in the run's update-group folder. With ``nnodes`` > 1 (torchrun) this host is
    node 0 and listens at ``master_addr:master_port`` for the others (:func:`join_command`)."""
    worker = ["--control-file", str(control_file)]
    if launcher == "torchrun":
        logs = control_file.parent / TORCHRUN_LOGS
        return torchrun_command(nproc, nnodes, 0, (master_addr, master_port), logs, worker)
    if launcher == "deepspeed":
        nodes = ["--hostfile", str(Path(hostfile).expanduser().resolve())] if hostfile else []
        return [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            *nodes,
            "--num_gpus",
            str(nproc),
            "--master_port",
            str(master_port),
            "--no_local_rank",
            "--module",
            WORKER_MODULE,
            *worker,
        ]
    raise ValueError(f"unknown launcher {launcher!r}; use 'torchrun' or 'deepspeed'")


def torchrun_command(
    nproc: int, nnodes: int, node_rank: int, master: tuple[str, int], log_dir: Path, worker: list[str]
) -> list[str]:
    """torchrun's command line for node ``node_rank`` of ``nnodes``: the static rendezvous at ``master`` (node 0's
    agent listens there), so node r's local ranks are the global ranks r*nproc .. r*nproc+nproc-1 on every start."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        master[0],
        "--master_port",
        str(master[1]),
        "--log-dir",
        str(log_dir),
        "-m",
        WORKER_MODULE,
        *worker,
    ]


def group_environment() -> dict[str, str]:
    """The environment a group's processes start with: this process's, less the variables of its own one-process
    world or of a fault meant for it, with DeepSpeed's CPU accelerator where there is no GPU."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    if not _cuda_available():
        env.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator (gloo), without its probing warning
    return env


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (from /proc; None without /proc or such a process), to tell a pid from its
    reuse."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None  # field 22 of /proc/<pid>/stat


def process_alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` still runs (not exited, not a zombie waiting to be reaped, not reused: same ``start``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(pid)
    if fields is None:
        return start is None  # no /proc here: the pid's existence is all we can tell
    return fields[0] != "Z" and (start is None or fields[19] == start)


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), counted after the parenthesised command name."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


class UpdateGroup:
    """This process's handle on a running group: send commands, get replies, stop it."""

    def __init__(
        self,
        process: subprocess.Popen,
        connection: socket.socket,
        log: Path,
        hello: dict[str, Any],
        span: Span = Span(),
    ):
        self.process, self.connection, self.log, self.span = process, connection, log, span
        self.world_size = int(hello["world_size"])
        self.worker_pids = [int(pid) for pid in hello["pids"]]
        self.hosts = list(hello["hosts"])
        self._buffer = b""
        self._stopped = False
        self.ready: dict[str, Any] = {}  # rank 0's reply to ``init`` (device, threads, shared weights)
        self.last_timing: dict[str, float] = {}  # the group's own times of the last update (update, hand-off)
        atexit.register(self.stop)

    # -- start ---------------------------------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        launcher: str,
        nproc: int,
        hostfile: str | None,
        folder: Path,
        init: dict[str, Any],
        nnodes: int = 1,
        endpoint: str | None = None,
    ) -> UpdateGroup:
        """Launch the group, wait for rank 0 to connect, and send it ``init`` (config, data root, run id, start model,
        precision): every rank builds its engines. ``folder`` (the lake's update-group folder of the run) takes the
        control file and the log. With ``nnodes`` > 1 this host is node 0 at ``endpoint`` and rank 0 connects once
        every other node has joined (:mod:`ragen_core.training.nodes`). Raises :class:`GroupError` if the group does
        not come up (:class:`GroupNodeError` when another node did not join as the config says)."""
        from ragen_core.training.distributed import free_port

        folder.mkdir(parents=True, exist_ok=True)
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(1.0)
        token = secrets.token_hex(16)
        control = folder / f"control-{os.getpid()}.json"
        parent = {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start_time(os.getpid())}
        control.unlink(missing_ok=True)  # created afresh below, readable by this user only
        descriptor = os.open(control, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({"address": ["127.0.0.1", server.getsockname()[1]], "token": token, "parent": parent}, handle)
        log = folder / f"group-{os.getpid()}.log"
        span = Span(nnodes, nproc, endpoint)
        master = rendezvous_address(endpoint) if endpoint else ("127.0.0.1", free_port())
        command = launch_command(launcher, nproc, master[1], control, hostfile, nnodes, master[0])
        with open(log, "ab") as output:
            output.write(f"$ {' '.join(command)}\n".encode())
            if nnodes > 1:
                LOG.warning("update group: waiting for %d more node(s): on each, `%s`", nnodes - 1, span.hint())
            output.flush()
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, env=group_environment(), cwd=os.getcwd()
            )
        try:
            connection, hello = _accept(server, process, token, log)
        except GroupError:
            end_launcher(process)
            if nnodes > 1:  # most often a node that did not join: say so in one line
                raise span.not_up(log, _last_error(log) or f"the launcher exited ({process.returncode})") from None
            raise
        except BaseException:
            end_launcher(process)
            raise
        finally:
            server.close()
            control.unlink(missing_ok=True)
        group = cls(process, connection, log, hello, span)
        if nnodes > 1 and group.world_size != nnodes * nproc:  # the ranks check it too (a hostfile sets its own)
            group.stop()
            raise span.not_up(
                log, f"{group.world_size} ranks joined, not trainer.nnodes x trainer.nproc = {nnodes * nproc}"
            )
        try:
            group.ready = group.call({"op": "init", **init})
        except BaseException:
            group.stop()
            raise
        return group

    # -- commands ------------------------------------------------------------------------------------------------
    def call(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send one command, wait for its reply (while watching that the group is alive), return the reply."""
        self.send(command)
        return self.receive(command["op"])

    def send(self, command: dict[str, Any]) -> None:
        """Send one command without waiting for the reply (see :meth:`receive`)."""
        if self._stopped:
            raise GroupError("the update group was stopped; open a new session (resume the run) to start another")
        try:
            self.connection.sendall((json.dumps(command) + "\n").encode())
        except OSError as exc:
            raise self._died(f"could not send {command['op']!r} ({exc})") from exc

    def receive(self, op: str) -> dict[str, Any]:
        """The reply to the last command sent; :class:`GroupError` if the group reports a failure or dies."""
        while b"\n" not in self._buffer:
            try:
                chunk = self.connection.recv(1 << 16)
            except TimeoutError:
                if self.process.poll() is not None:
                    raise self._died(f"the launcher exited ({self.process.returncode}) during {op!r}") from None
                continue
            except OSError as exc:
                raise self._died(f"the connection failed during {op!r} ({exc})") from exc
            if not chunk:
                raise self._died(f"rank 0 closed the connection during {op!r}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line)
        if not reply.get("ok"):
            self._stopped = True  # a failing group ends itself
            if reply.get("lost") and self.span.nnodes > 1:
                raise self.span.ended(self.log, f"a rank's connection to {reply['lost']} broke during {op!r}")
            raise GroupError(f"the update group failed {op!r}:\n{reply.get('error')}\n(log: {self.log})")
        return reply

    def update(self, iteration: int, export: bool = True) -> tuple[dict[str, float], Path | None]:
        """Stage 5 in the group: the StarPO update on iteration ``iteration``'s kept rows. Returns the metrics and,
        with ``export``, the folder of the exported new policy (None without: the new weights are in the shared
        buffer when the group was started with ``shared_weights``)."""
        reply = self.call({"op": "update", "iteration": iteration, "export": export})
        self.last_timing = {k: float(v) for k, v in reply.get("timing", {}).items()}
        weights = Path(reply["weights"]) if reply["weights"] else None
        return {k: float(v) for k, v in reply["metrics"].items()}, weights

    def restore(self, checkpoint: Path | None, replay: list[int]) -> Path:
        """Load ``checkpoint`` (None: keep the start weights) and replay the committed updates of ``replay``; returns
        the folder of the exported policy."""
        reply = self.call({"op": "restore", "checkpoint": str(checkpoint) if checkpoint else None, "replay": replay})
        return Path(reply["weights"])

    def save(self, updates: int, extra: dict[str, Any], fault: Any = None) -> Path:
        """Save a checkpoint after ``updates`` updates (every rank writes its ZeRO shard). ``fault`` (a callable run
        while the group saves) is the ``checkpoint:mid_save`` fault point of this process."""
        self.send({"op": "save", "updates": updates, "extra": extra})
        if fault is not None:
            fault()
        return Path(self.receive("save")["path"])

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about the group."""
        return {
            "nnodes": self.span.nnodes,
            "world_size": self.world_size,
            "launcher_pid": self.process.pid,
            "worker_pids": self.worker_pids,
            "hosts": self.hosts,
            "threads": self.ready.get("threads"),
            "log": str(self.log),
        }

    # -- stop ----------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the group to exit, wait for the launcher, and end it if it does not exit in time (idempotent)."""
        if self._stopped and self.process.poll() is not None:
            return
        self._stopped = True
        try:
            self.connection.sendall(b'{"op": "stop"}\n')
        except OSError:
            pass
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            end_launcher(self.process)
        self.connection.close()
        atexit.unregister(self.stop)

    def _died(self, what: str) -> GroupError:
        self._stopped = True
        end_launcher(self.process)
        if self.span.nnodes > 1:
            return self.span.ended(self.log, what)
        return GroupError(f"the update group died: {what}. End of its log ({self.log}):\n{_tail(self.log)}")


def _accept(
    server: socket.socket, process: subprocess.Popen, token: str, log: Path
) -> tuple[socket.socket, dict[str, Any]]:
    """Wait for rank 0's connection and hello (checking the token); fail if the launcher exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise GroupError(f"the update group exited ({process.returncode}) while starting:\n{_tail(log)}")
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        connection.settimeout(1.0)
        hello, reader = b"", time.monotonic() + 30
        while b"\n" not in hello and time.monotonic() < reader:
            try:
                chunk = connection.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                break
            hello += chunk
        try:
            message = json.loads(hello.split(b"\n", 1)[0])
        except ValueError:
            message = {}
        if secrets.compare_digest(str(message.get("token", "")), token):
            return connection, message
        connection.close()  # not our rank 0
    raise GroupError(f"the update group did not connect within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def end_launcher(process: subprocess.Popen) -> None:
    """Terminate the launcher (it forwards the signal to its workers), then kill it if it lingers."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=20)


def _last_error(log: Path) -> str:
    """The last ``error:`` line a rank wrote to the group's log (say, a node that joined with other ranks)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip()[len("error: ") :] for line in reversed(lines) if line.strip().startswith("error: ")), "")


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
