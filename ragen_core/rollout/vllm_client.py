"""The trainer's side of a vLLM rollout server: the requests every server answers (:class:`ServerClient`), and a server
started elsewhere with ``ragen rollout serve`` (:class:`RemoteServer`); one the run starts itself is
:class:`ragen_core.rollout.vllm_local.VLLMServer`.

The server program is :mod:`ragen_core.rollout.vllm_server`, run by the vLLM environment's Python (``make
install-vllm``): vLLM cannot share this project's environment (its pins on fastapi and transformers clash with
Prefect's), so, as TRL's ``trl vllm-serve`` does, it runs as a program of its own.

- A server the run starts listens on 127.0.0.1 at a port the OS picks, in a process group of its own, and is stopped
  with the run (:meth:`VLLMServer.close`, also on Ctrl-C, failures and at interpreter exit); when the trainer is
  killed outright, the pipe it alone held open reaches end-of-file and the server's watchdog ends the server. Its log
  is ``runs/<id>/vllm_server/server.log`` under the data root.
- A server started elsewhere outlives runs: the run connects to it (its token from ``$RAGEN_ROLLOUT_TOKEN``, shared
  with ``ragen rollout serve``), checks it serves in the run's precision (and adapters of the run's rank), pushes the
  run's weights into it and leaves it running when the run ends.
- Every push of full weights names a fresh tag the server keeps, and every ``/generate`` names the tag its client
  pushed last: a server restarted meanwhile, or loaded by another run, refuses the request instead of sampling with
  other weights (off-policy rows).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROLLOUT_TOKEN_VARIABLE = "RAGEN_ROLLOUT_TOKEN"  # the secret a run and the servers started elsewhere share
MIN_TOKEN_LENGTH = 16
UNLOADED = "unloaded"  # the tag a client names while a push it made has not completed: no server holds it
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # the run's precision -> vLLM's dtype


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A rollout server never redirects: an answer that does is an error, never followed (the token would go along)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


# Requests to the server never go through a proxy (http_proxy and friends would send cluster traffic elsewhere) and
# never follow a redirect.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


class BackendUnavailable(RuntimeError):
    """The vLLM environment is missing or cannot start a server; the message says what to do."""


class VLLMServerError(RuntimeError):
    """A vLLM server failed a request, died or holds other weights; the message names it (and its log). ``lost``:
    the server is gone or no longer holds the run's weights (no answer, a cut connection, a restart), rather than
    refusing this one request."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


def rollout_token() -> str:
    """The secret shared with servers started by ``ragen rollout serve`` (``$RAGEN_ROLLOUT_TOKEN``); raises
    :class:`BackendUnavailable` saying how to set it when it is missing or too short to be a secret."""
    token = os.environ.get(ROLLOUT_TOKEN_VARIABLE, "")
    if len(token) < MIN_TOKEN_LENGTH:
        state = "is not set" if not token else f"is shorter than {MIN_TOKEN_LENGTH} characters"
        raise BackendUnavailable(
            f"{ROLLOUT_TOKEN_VARIABLE} {state}: a run and the rollout servers it uses share it (set the same value "
            f"where the run and where `ragen rollout serve` start, e.g. export {ROLLOUT_TOKEN_VARIABLE}=$(openssl "
            "rand -hex 16))"
        )
    return token


class ServerClient:
    """Requests to one vLLM rollout server at ``url``, authorised by ``token``; ``name`` is how errors call it."""

    def __init__(self, url: str, token: str, name: str, tolerance: float = 1e-4) -> None:
        self.url, self.token, self.name = url.rstrip("/"), token, name
        self.tolerance = tolerance  # largest log-prob difference from the trainer's model the weight check accepts
        self.weights: str | None = None  # the tag of the weights pushed last, named by every /generate
        self.push_seconds: list[float] = []  # time of each weight push (reload + check)

    # -- how a failure is told: a server this process started knows its process and log ---------------------------

    def _lost(self, path: str, exc: BaseException) -> str:
        return f"{self.name} did not answer on {path} ({exc})"

    def _where(self) -> str:
        return ""

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 3600.0) -> dict[str, Any]:
        """``GET path`` (no body: ``/health``, which carries no token, so a URL that is not the server learns
        nothing) or ``POST path`` with ``body`` and the token; the answer's JSON object."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if body is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        method = "GET" if body is None else "POST"
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers, method=method)
        try:
            with _DIRECT.open(request, timeout=timeout) as answer:
                found = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except (ValueError, AttributeError):
                detail = detail[:200]
            where = f"{self.name} answered {exc.code} to {path}: {detail}{self._where()}"
            raise VLLMServerError(where, lost=exc.code == 409) from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            raise VLLMServerError(self._lost(path, exc), lost=True) from None
        except ValueError:  # JSON that is not: another program answers at the URL
            found = None
        if not isinstance(found, dict):
            raise VLLMServerError(f"{self.name} answered {path} with no rollout server's JSON: is it one?", lost=True)
        return found

    def health(self, timeout: float = 10.0) -> dict[str, Any]:
        """The server's ``/health`` answer (state, pid, token digest, dtype, LoRA settings, weights tag)."""
        return self._request("/health", timeout=timeout)

    def _ours(self, health: dict[str, Any]) -> bool:
        return health.get("token_digest") == hashlib.sha256(self.token.encode()).hexdigest()

    # -- requests ---------------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        sampling: list[dict[str, Any]],
        adapter: int | None = None,
        salt: str | None = None,
    ) -> list[dict[str, Any]]:
        """One completion per prompt (``sampling``: one settings dict each, see the server's ``/generate``), by the
        weights pushed last (or the adapters of version ``adapter``); ``salt``: cached prefixes are shared only
        with requests of the same salt."""
        if not prompts:
            return []
        body = {"prompts": prompts, "sampling": sampling, "adapter": adapter, "weights": self.weights}
        if salt is not None:
            body["salt"] = salt
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
        tag = secrets.token_hex(8)
        self.weights = UNLOADED  # whatever happens below, the adapters the server holds are no longer the ones tagged
        body = {"path": str(Path(folder).resolve()), "version": version, "keep": keep, "tag": tag}
        self._request("/load_adapter", body)
        self.weights = tag
        difference = 0.0 if reference is None else self.check_weights(reference, adapter=version)
        self.push_seconds.append(time.perf_counter() - started)
        return difference

    def load_weights(self, folder: Path, reference: Any = None) -> float:
        """Reload the policy from the Hugging Face export in ``folder`` (under a fresh tag, which later requests
        name); with ``reference`` (the trainer's model), check that the server now scores as the reference does
        (:meth:`check_weights`). Returns the largest log-prob difference (0.0 without a reference); raises
        :class:`VLLMServerError`."""
        started = time.perf_counter()
        tag = secrets.token_hex(8)
        self.weights = UNLOADED  # whatever happens below, the weights the server holds are no longer the ones tagged
        self._request("/load_weights", {"path": str(Path(folder).resolve()), "tag": tag})
        self.weights = tag
        difference = 0.0 if reference is None else self.check_weights(reference)
        self.push_seconds.append(time.perf_counter() - started)
        return difference

    def check_weights(
        self, reference: Any, tolerance: float | None = None, adapter: int | None = None, expected: Any = None
    ) -> float:
        """Largest log-prob difference between the server (with the adapters of version ``adapter``, if given) and
        ``reference`` on a fixed probe sequence; an error above ``tolerance`` (None: the server's own).
        ``expected``: ``(probe, reference log-probs)`` computed once for several servers."""
        from ragen_core.rollout.vllm_backend import probe_sequence, reference_logprobs

        tolerance = self.tolerance if tolerance is None else tolerance
        probe, wanted = expected if expected is not None else (probe_sequence(reference), None)
        served = self.score([probe], adapter)[0]
        wanted = reference_logprobs(reference, probe) if wanted is None else wanted
        difference = max(abs(a - b) for a, b in zip(served, wanted, strict=True))
        if not difference <= tolerance:
            raise VLLMServerError(
                f"{self.name} does not score with the trainer's weights after the push (log-probs differ by "
                f"{difference:.3g} > {tolerance:g} on the probe); rollouts would be off-policy{self._where()}"
            )
        return difference

    def close(self) -> None:
        """Nothing to stop: a server started elsewhere outlives the run."""


class RemoteServer(ServerClient):
    """A rollout server started elsewhere with ``ragen rollout serve``: connected to, never stopped by the run."""

    pid: int | None = None  # the server's process id on its host

    def _lost(self, path: str, exc: BaseException) -> str:
        return f"{self.name} did not answer on {path} ({exc}); is `ragen rollout serve` still running there?"

    def helper_group(self) -> int | None:
        """The server's process group when it runs on this machine's loopback (the tests' stand-in for another
        host, whose fault points kill it), else None."""
        from ragen_core.config.trust import loopback_host

        try:
            return os.getpgid(self.pid) if self.pid is not None and loopback_host(self.url) else None
        except (ProcessLookupError, PermissionError):
            return None

    @classmethod
    def connect(
        cls,
        url: str,
        token: str,
        name: str,
        *,
        dtype: str,
        lora_rank: int | None = None,
        loras: int = 1,
        tolerance: float = 1e-4,
        timeout: float = 60.0,
    ) -> RemoteServer:
        """Connect to the server at ``url`` and check it is a ready rollout server that knows ``token``, serves
        ``dtype``, and (``lora_rank``) adapters of that rank, ``loras`` versions at once; waits up to ``timeout``
        seconds for one still loading. Raises :class:`BackendUnavailable` saying what to change."""
        server = cls(url, token, name, tolerance)
        deadline = time.monotonic() + timeout
        while True:
            health = server.known_health()
            if health.get("state") == "ready":
                break
            if health.get("state") == "failed" or time.monotonic() > deadline:
                raise BackendUnavailable(f"{name} is not ready ({health.get('state')}: {health.get('error')})")
            time.sleep(0.5)
        server._check_settings(health, dtype, lora_rank, loras)
        server.weights, server.pid = health.get("weights"), health.get("pid")
        return server

    def known_health(self) -> dict[str, Any]:
        """The server's ``/health``, once it answers and knows the run's token; else :class:`BackendUnavailable`
        (asked before a run loads anything, and when it connects)."""
        try:
            health = self.health()
        except VLLMServerError as exc:
            raise BackendUnavailable(str(exc)) from None
        if not self._ours(health):
            raise BackendUnavailable(
                f"{self.name} does not know this run's {ROLLOUT_TOKEN_VARIABLE}: start `ragen rollout serve` there "
                "with the same value in its environment"
            )
        return health

    def _check_settings(self, health: dict[str, Any], dtype: str, lora_rank: int | None, loras: int) -> None:
        wrong = []
        if health.get("dtype") != dtype:
            wrong.append(f"it serves {health.get('dtype')}, the run trains in {dtype}: start it with --dtype {dtype}")
        served_rank = health.get("max_lora_rank") or 0
        if lora_rank is not None and served_rank < lora_rank:
            wrong.append(f"it serves adapters up to rank {served_rank}: start it with --max-lora-rank {lora_rank}")
        if lora_rank is not None and (health.get("max_loras") or 0) < loras:
            wrong.append(f"it keeps {health.get('max_loras')} adapter version(s): start it with --max-loras {loras}")
        if wrong:
            raise BackendUnavailable(f"{self.name} cannot serve this run: {'; '.join(wrong)}")
