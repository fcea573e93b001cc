"""A local Prefect server and process worker for deployments, started and stopped by PID (``ragen server``).

Everything binds 127.0.0.1. State (PIDs, port, logs, the server's PREFECT_HOME) lives in ``<state dir>`` (default
``.prefect-local/`` in the project), so ``stop`` finds exactly the processes ``start`` made. This module drives
Prefect through its command line, the way users do; it imports nothing of Prefect.

It also starts the temporary server of one command (``ragen train`` and the others when no server is configured):
:func:`start_temporary`. Unlike the one Prefect would start itself, it runs in its own session, so a Ctrl-C on the
terminal reaches only the command (which then stops cleanly, reporting to a server that is still up, and stops the
server last), and it dies with the command (Linux: the kernel's parent-death signal), so a SIGKILLed run leaves no
server behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ragen_cli import prefect_template

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = PROJECT_DIR / ".prefect-local"
POOL = "local-process"


class ServerError(RuntimeError):
    """The local server or worker could not be started or reached."""


@dataclass
class ServerState:
    """What ``start`` recorded: the API address and the PIDs to stop."""

    api_url: str
    port: int
    server_pid: int
    worker_pid: int | None
    pool: str
    home: str

    def save(self, state_dir: Path) -> None:
        path = state_dir / "server.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)


def read_state(state_dir: Path = DEFAULT_STATE_DIR) -> ServerState | None:
    """The recorded state, or None when nothing was started from ``state_dir``."""
    path = state_dir / "server.json"
    return ServerState(**json.loads(path.read_text())) if path.is_file() else None


def free_port() -> int:
    """A free loopback port chosen by the OS."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int) -> None:
    """Raise :class:`ServerError` unless ``port`` is a valid TCP port that nothing listens on at 127.0.0.1 (a server
    started there would fail, and the one already listening would answer the health check in its place)."""
    if not 0 < port < 65536:
        raise ServerError(f"--port {port} is not a TCP port: give 1-65535, or 0 for any free port")
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise ServerError(
                f"port {port} on 127.0.0.1 is in use (another server?); choose another --port, or 0 for a free one"
            ) from None


def _prefect() -> list[str]:
    return [sys.executable, "-m", "prefect"]


# A launcher's rendezvous describes one process group: flow runs started by a worker must each make their own (two
# runs sharing one MASTER_PORT fail with EADDRINUSE), so the worker never inherits them.
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def base_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    """Environment for the server, the worker and ``prefect`` commands: loopback only, no telemetry, no inherited
    distributed rendezvous."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        RAGEN_PROJECT_DIR=str(PROJECT_DIR),
        PREFECT_SERVER_API_HOST="127.0.0.1",
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    else:
        env.pop("PREFECT_API_URL", None)
    return env


def _spawn(command: list[str], env: dict[str, str], log: Path, cwd: Path = PROJECT_DIR) -> subprocess.Popen:
    with log.open("ab") as sink:  # the child keeps its own descriptor
        return subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_healthy(api_url: str, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Poll ``<api>/health`` until it answers (or the process died, or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServerError(f"the Prefect server exited with code {process.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise ServerError(f"the Prefect server at {api_url} did not answer within {timeout:.0f} s")


def run_prefect(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    """Run one ``prefect`` command; raise :class:`ServerError` with its output when it fails."""
    done = subprocess.run(_prefect() + args, env=env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ServerError(f"`prefect {' '.join(args)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def start(
    port: int = 4200,
    state_dir: Path = DEFAULT_STATE_DIR,
    worker: bool = True,
    deploy: bool = True,
    timeout: float = 180,
    step: Callable[[str], None] | None = None,
) -> ServerState:
    """Start a server on 127.0.0.1:``port`` (0: a free one), create the work pool, deploy prefect.yaml and start a
    process worker. Refuses when ``state_dir`` already has live processes (stop them first). ``step`` hears of each
    step as it starts (the server's start alone can take a minute)."""
    say = step or (lambda text: None)
    previous = read_state(state_dir)
    if previous is not None and any(alive(p) for p in (previous.server_pid, previous.worker_pid) if p):
        raise ServerError(f"a server started from {state_dir} is still running ({previous.api_url}); stop it first")
    port = port or free_port()
    check_port_free(port)
    state_dir.mkdir(parents=True, exist_ok=True)
    home = state_dir / "home"
    home.mkdir(exist_ok=True)
    prefect_template.seed(home)  # only a home without a database yet
    api_url = f"http://127.0.0.1:{port}/api"
    command = _prefect() + ["server", "start", "--host", "127.0.0.1", "--port", str(port)]
    say(f"starting the Prefect server on 127.0.0.1:{port} (log: {state_dir / 'server.log'}; up to {timeout:.0f} s)")
    server = _spawn(command, base_env(home), state_dir / "server.log")
    state = ServerState(api_url, port, server.pid, None, POOL, str(home))
    state.save(state_dir)
    try:
        wait_healthy(api_url, timeout, server)
        if server.poll() is not None:  # what answered is not the server started here
            raise ServerError(
                f"the Prefect server exited with code {server.returncode}; another one answers at "
                f"{api_url}: choose another --port"
            )
        prefect_template.save(home)  # a no-op once a template exists
        env = base_env(home, api_url)
        say(f"the server answers; creating the work pool {POOL}")
        ensure_pool(env)
        if deploy:
            say("deploying prefect.yaml's deployments (prefect deploy --all)")
            run_prefect(["--no-prompt", "deploy", "--all"], env)
        if worker:
            say(f"starting a process worker for {POOL} (log: {state_dir / 'worker.log'})")
            state.worker_pid = start_worker(env, state_dir / "worker.log").pid
            state.save(state_dir)
    except BaseException:
        stop(state_dir)
        raise
    return state


def ensure_pool(env: dict[str, str], pool: str = POOL) -> None:
    """Create the process work pool unless it exists (a restarted server keeps its database, pool included)."""
    # `work-pool inspect` by name, not a search in `work-pool ls`: that table cuts long names to the terminal's width
    done = subprocess.run(
        _prefect() + ["work-pool", "inspect", pool],
        env=env,
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        run_prefect(["work-pool", "create", pool, "--type", "process"], env)


def start_worker(env: dict[str, str], log: Path, pool: str = POOL) -> subprocess.Popen:
    """A process worker for ``pool`` in its own session (so it and its flow runs stop together)."""
    return _spawn(_prefect() + ["worker", "start", "--pool", pool], env, log)


def alive(pid: int) -> bool:
    """Whether a process with this PID runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS): existence is all we can tell
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_process(pid: int, first: signal.Signals, grace: float = 20) -> None:
    """Send ``first`` to the process group led by ``pid``, then SIGKILL what is left after ``grace`` seconds."""
    if not alive(pid):
        return
    try:
        os.killpg(pid, first)
    except ProcessLookupError:
        return
    if _gone_within(pid, grace, 0.2):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _gone_within(pid, 10, 0.05)  # SIGKILL is not instant: return once it is gone


def _gone_within(pid: int, seconds: float, pause: float) -> bool:
    """Wait up to ``seconds`` for the process to be gone (reaped when it is our child); True when it is."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            finished = 0
        if finished == pid or not alive(pid):
            return True
        time.sleep(pause)
    return False


def stop(state_dir: Path = DEFAULT_STATE_DIR) -> bool:
    """Stop the worker (SIGINT: it lets go of its flow runs) and the server (SIGTERM), by their recorded PIDs."""
    state = read_state(state_dir)
    if state is None:
        return False
    if state.worker_pid:
        stop_process(state.worker_pid, signal.SIGINT)
    stop_process(state.server_pid, signal.SIGTERM)
    (state_dir / "server.json").unlink(missing_ok=True)
    return True


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive SIGTERM when its parent dies, even by SIGKILL (Linux; elsewhere
    None). libc is loaded here, before the fork; the child only calls it. A parent that died before the call is seen
    by the child's changed parent PID."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


@dataclass
class TemporaryServer:
    """A Prefect server for one command: its process (leader of its own session), API address and log file."""

    process: subprocess.Popen
    api_url: str
    log: Path

    def stop(self, grace: float = 5) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (idempotent)."""
        stop_process(self.process.pid, signal.SIGTERM, grace)
        if self.process.poll() is None:  # reap it (SIGKILLed by stop_process): no zombie, no ResourceWarning
            self.process.wait(timeout=5)


def start_temporary(home: Path, timeout: float, attempts: int = 3) -> TemporaryServer:
    """Start a temporary Prefect server (API only, no UI, SQLite under ``home``) on a free loopback port and wait
    until it answers. It runs what Prefect's own temporary server runs (uvicorn over Prefect's app factory, with
    the flags Prefect sets for it), but in its own session and tied to this process's life (see the module's
    docstring). Retries on another port when the port was taken in between."""
    env = base_env(home)
    env.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
    log = home / "server.log"
    seeded = prefect_template.seed(home)  # a ready database: about half the start-up (ragen_cli/prefect_template.py)
    for attempt in range(attempts):
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ]
        with log.open("ab") as sink:
            process = subprocess.Popen(
                command,
                env=env,
                cwd=home,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        server = TemporaryServer(process, f"http://127.0.0.1:{port}/api", log)
        try:
            wait_healthy(server.api_url, timeout, process)
            prefect_template.save(home)  # a no-op once a template exists
            return server
        except ServerError:
            exited = process.poll() is not None  # an early exit may be a port taken in between: try another
            server.stop()
            if seeded and attempt < attempts - 1:  # a template no server starts from is dropped: migrate afresh
                prefect_template.unseed(home)
                prefect_template.discard()
                seeded = False
                continue
            if not exited or attempt == attempts - 1:
                from ragen_core.storage.maintenance.space import space_limited, space_message

                if space_limited(home):  # its database could not grow: say so, not just "did not start"
                    what = f"the temporary Prefect server's database (its log: {log})"
                    raise ServerError(space_message(None, what)) from None
                raise ServerError(f"the temporary Prefect server did not start (its log: {log})") from None
        except BaseException:  # Ctrl-C while waiting
            server.stop()
            raise
    raise AssertionError("unreachable")
