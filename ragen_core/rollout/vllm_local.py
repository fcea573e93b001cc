"""A vLLM rollout server the run starts itself (:class:`VLLMServer`, ``rollout.vllm.servers: [local]``), and finding
the vLLM environment's Python that runs it (:func:`vllm_python`) — also for ``ragen rollout serve``.

The server program (:mod:`ragen_core.rollout.vllm_server`) listens on 127.0.0.1 at a port the OS picks, in a process
group of its own, and is stopped with the run (:meth:`VLLMServer.close`, also on Ctrl-C, failures and at interpreter
exit); when the trainer is killed outright, the pipe it alone held open reaches end-of-file and the server's watchdog
ends the server (through any wrapper script in between). Its log is ``runs/<id>/vllm_server/server.log`` under the
data root.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ragen_core.rollout.vllm_client import ROLLOUT_TOKEN_VARIABLE, BackendUnavailable, ServerClient, VLLMServerError

SERVER_PROGRAM = Path(__file__).with_name("vllm_server.py")
VLLM_ENV_VARIABLE = "RAGEN_VLLM_PYTHON"
VLLM_ENV_FOLDER = ".venv-vllm"  # where `make install-vllm` builds the environment, beside the project's .venv
INSTALL_HINT = "build it with `make install-vllm` (or point rollout.vllm.python / RAGEN_VLLM_PYTHON at its python)"


def vllm_python(setting: str | None = None, data_root: Path | None = None) -> Path:
    """The Python of the vLLM environment: ``setting`` (``rollout.vllm.python``), else ``$RAGEN_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` beside the environment running this code (or in the working folder, unless that lies
    in ``data_root``: a file planted in a shared data root never becomes the program run). Raises
    :class:`BackendUnavailable` saying how to build it when there is none."""
    chosen = setting or os.environ.get(VLLM_ENV_VARIABLE)
    if chosen:
        path = Path(chosen).expanduser()
        where = "rollout.vllm.python" if setting else VLLM_ENV_VARIABLE
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BackendUnavailable(f"{where}={chosen} is not an executable Python; {INSTALL_HINT}")
        return path
    candidates = [
        Path(sys.prefix).parent / VLLM_ENV_FOLDER / "bin" / "python",
        Path.cwd() / VLLM_ENV_FOLDER / "bin" / "python",
    ]
    shared = Path(data_root).resolve() if data_root is not None else None
    for candidate in candidates:
        if shared is not None and candidate.parent.parent.resolve().is_relative_to(shared):
            continue
        if candidate.is_file() and (candidate.parent.parent / ".installed").is_file():
            return candidate
    raise BackendUnavailable(f"rollout.backend=vllm needs the vLLM environment, which is not built: {INSTALL_HINT}")


class VLLMServer(ServerClient):
    """A vLLM rollout server this process started, and the client that talks to it."""

    def __init__(
        self,
        process: subprocess.Popen,
        port: int,
        token: str,
        log_path: Path,
        tolerance: float = 1e-4,
        lifeline: int | None = None,
        name: str = "the vLLM server",
    ) -> None:
        super().__init__(f"http://127.0.0.1:{port}", token, name, tolerance)
        self.process, self.port, self.log_path = process, port, log_path
        self._lifeline = lifeline  # the write end of the pipe whose end-of-file tells the server this process is gone
        self._closed = False
        atexit.register(self.close)

    @classmethod
    def start(
        cls,
        python: Path,
        model_dir: Path,
        folder: Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        enforce_eager: bool = False,
        prefix_caching: bool = True,
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float = 0.4,
        tensor_parallel_size: int = 1,
        startup_timeout: float = 600.0,
        check_tolerance: float | None = None,
        max_lora_rank: int | None = None,
        max_loras: int = 1,
        name: str = "the vLLM server",
        log_name: str = "server.log",
    ) -> VLLMServer:
        """Start the server on ``model_dir`` and wait until its engine is ready (its log: ``folder/log_name``).
        Raises :class:`BackendUnavailable` when it dies or is not ready within ``startup_timeout`` seconds.
        ``check_tolerance``: what the weight check accepts (None: 1e-4 in float32, 0.1 in half precision).
        ``max_lora_rank``: serve a LoRA policy's adapters (:meth:`load_adapter`) up to that rank (one of vLLM's
        allowed values), ``max_loras`` versions resident at once."""
        tolerance = check_tolerance if check_tolerance is not None else (1e-4 if dtype == "float32" else 0.1)
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / log_name
        ready_file = folder / f"ready-{secrets.token_hex(4)}.json"
        token = secrets.token_hex(16)
        lifeline_read, lifeline = os.pipe()  # the server watches the read end: end-of-file when we are gone
        options = {
            "--model": model_dir,
            "--ready-file": ready_file,
            "--lifeline-fd": lifeline_read,
            "--dtype": dtype,
            "--seed": seed,
            "--tensor-parallel-size": tensor_parallel_size,
            "--gpu-memory-utilization": gpu_memory_utilization,
            "--max-model-len": max_model_len,
            "--kv-cache-gib": kv_cache_gib,
            "--enforce-eager": enforce_eager,
            "--prefix-caching": prefix_caching,
            "--max-lora-rank": max_lora_rank,
            "--max-loras": max_loras if max_lora_rank else None,
        }
        command = [str(python), "-I", str(SERVER_PROGRAM), *server_arguments(options)]
        process = _spawn(command, token, log_path, lifeline_read, lifeline)
        server: VLLMServer | None = None
        try:
            port = _wait_for_port(process, ready_file, log_path, startup_timeout)
            server = cls(process, port, token, log_path, tolerance, lifeline, name)
            server._wait_until_ready(time.monotonic() + startup_timeout)
            return server
        except BaseException:
            if server is not None:
                server.close()
            else:
                _kill_group(process)
                os.close(lifeline)
            raise
        finally:
            ready_file.unlink(missing_ok=True)

    def _lost(self, path: str, exc: BaseException) -> str:
        fate = process_fate(self.process, 0.0 if _timed_out(exc) else 3.0)
        return f"{self.name} {fate} on {path} ({exc}); see its log {self.log_path}{last_line(self.log_path)}"

    def _where(self) -> str:
        return f" (log: {self.log_path})"

    def helper_group(self) -> int:
        """The process group the server runs in (its own)."""
        return self.process.pid

    def _wait_until_ready(self, deadline: float) -> None:
        while True:
            if self.process.poll() is not None:
                raise BackendUnavailable(
                    f"{self.name} exited with status {self.process.returncode} while starting; see its log "
                    f"{self.log_path}{last_line(self.log_path)}"
                )
            try:
                health = self.health()
            except VLLMServerError:
                health = {}
            ours = self._ours(health) and _in_group(health.get("pid"), self.process.pid)
            if health and not ours:
                raise BackendUnavailable(f"port {self.port} is answered by another server (pid {health.get('pid')})")
            if health.get("state") == "ready":
                self.weights = health.get("weights")
                return
            if health.get("state") == "failed":
                raise BackendUnavailable(
                    f"{self.name} could not load the model: {health.get('error')} (log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"{self.name} was not ready within the start-up timeout (rollout.vllm.startup_timeout); "
                    f"see its log {self.log_path}{last_line(self.log_path)}"
                )
            time.sleep(0.5)

    def close(self) -> None:
        """Stop the server and everything it started (idempotent): ask it, then end its process group."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.process.poll() is None:
                self._request("/shutdown", {}, timeout=5)
                self.process.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a clean-up: the group is ended below whatever the request did
            pass
        finally:  # whatever happened above (a second Ctrl-C included), the group ends
            _kill_group(self.process)
            if self._lifeline is not None:
                os.close(self._lifeline)
                self._lifeline = None


def _spawn(command: list[str], token: str, log_path: Path, lifeline_read: int, lifeline: int) -> subprocess.Popen:
    """Start the server program in a process group of its own (a terminal's Ctrl-C reaches the trainer, which stops
    it), its output appended to ``log_path``, holding the pipe's read end; the write end stays with this process alone.
    The pipe's read end is closed here either way, the write end too when the start fails."""
    env = {**server_environment(), "RAGEN_VLLM_TOKEN": token}
    os.set_inheritable(lifeline, False)  # children must not keep the write end open
    try:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(lifeline_read,),
            )
    except BaseException:
        os.close(lifeline)
        raise
    finally:
        os.close(lifeline_read)


def server_environment() -> dict[str, str]:
    """The server program's environment: this one's, with vLLM's engine in the server's own process, no usage
    reports, no model downloads, no PYTHONPATH (the vLLM environment's own packages) and no rollout token (the
    server reads its own from ``RAGEN_VLLM_TOKEN``)."""
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("PYTHONPATH", None)
    env.pop(ROLLOUT_TOKEN_VARIABLE, None)
    return env


def server_arguments(options: dict[str, Any]) -> list[str]:
    """Command-line arguments: a flag for each True, ``--name value`` for each other value, nothing for None/False."""
    arguments: list[str] = []
    for name, value in options.items():
        if value is True:
            arguments.append(name)
        elif value is not None and value is not False:
            arguments += [name, str(value)]
    return arguments


def _wait_for_port(process: subprocess.Popen, ready_file: Path, log_path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while not ready_file.is_file():
        if process.poll() is not None:
            raise BackendUnavailable(
                f"the vLLM server exited with status {process.returncode} before listening; see its log "
                f"{log_path}{last_line(log_path)}"
            )
        if time.monotonic() > deadline:
            raise BackendUnavailable(f"the vLLM server did not start listening in {timeout:g} s (log: {log_path})")
        time.sleep(0.1)
    return int(json.loads(ready_file.read_text())["port"])


def process_fate(process: subprocess.Popen, grace: float = 3.0) -> str:
    """What became of a server that failed a request: ``died (killed by SIGKILL)``, ``died (exit status 1)`` or ``did
    not answer``. A refused or cut connection comes a moment before the killed process is seen exited (its sockets
    close first): it gets ``grace`` seconds to be."""
    try:
        code = process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return "did not answer"
    if code < 0:
        try:
            return f"died (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"died (killed by signal {-code})"
    return f"died (exit status {code})"


def _timed_out(exc: BaseException) -> bool:
    """Whether a failed request timed out (the server is there, busy or hung) rather than found no server."""
    return isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)


def _in_group(pid: Any, group: int) -> bool:
    """Whether process ``pid`` belongs to the process group ``group`` (the server's own, led by the process started;
    the server itself may be that process or, behind a wrapper script, its child)."""
    try:
        return isinstance(pid, int) and os.getpgid(pid) == group
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(process: subprocess.Popen) -> None:
    """End the server's process group (the server leads it) and reap the server."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def last_line(path: Path) -> str:
    """`` (its last line: ...)``: the log's last non-empty line, control characters escaped and cut to 200
    characters, for a one-line error (the whole log is in the file); empty when there is none."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 65536))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    if not lines:
        return ""
    last = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in lines[-1])
    return f" (its last line: {last[:200]}{'...' if len(last) > 200 else ''})"
