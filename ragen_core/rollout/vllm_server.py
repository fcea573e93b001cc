"""The vLLM rollout server: a small HTTP program run by the vLLM environment's Python (``make install-vllm``).

Never imported by the trainer (its environment has no vLLM, and vLLM's pins clash with Prefect's): the trainer starts
this file as a program (:class:`ragen_core.rollout.vllm_local.VLLMServer`) and talks JSON to it over 127.0.0.1, or
``ragen rollout serve`` runs it on another host (``--host``, ``--port``) for runs to use
(:class:`ragen_core.rollout.vllm_client.RemoteServer`). It imports only the standard library and vLLM, so it runs
from any checkout or installed copy of this package.

Endpoints (``POST`` bodies and answers are JSON; every ``POST`` must carry ``Authorization: Bearer <token>``, the
token given in ``RAGEN_VLLM_TOKEN``, so no other process can drive or stop the server):

- ``GET /health``: ``{"state": "loading" | "ready" | "failed", "pid", "token_digest", "error", "dtype",
  "max_lora_rank", "max_loras", "weights"}``; the trainer checks the digest of its token (and, for a server it
  started, the pid), so a server someone else runs on the port is never taken for its own, and the settings a run
  needs.
- ``POST /generate``: ``{"prompts": [[token ids]], "sampling": [{"temperature", "top_p", "top_k", "max_tokens",
  "seed", "stop_token_ids"}], "weights": tag, "salt": text}`` -> ``{"outputs": [{"token_ids", "logprobs"}]}``: one
  sampled completion per prompt by the weights tagged ``tag`` (answered 409 when the server holds others: it was
  restarted, or another client pushed since), its prefixes cached apart from requests of another ``salt``,
  the sampler's log-prob of each sampled token (``logprobs_mode="processed_logprobs"``: after temperature and
  top-k/top-p, as the trainer records them).
- ``POST /score``: ``{"sequences": [[token ids]]}`` -> ``{"logprobs": [[...]]}``: the model's log-prob of every token
  after the first (temperature 1), to check the server scores with the trainer's weights.
- ``POST /load_weights``: ``{"path": folder, "tag": tag}``: reload the policy in place from a Hugging Face export;
  later requests name ``tag``.
- ``POST /load_adapter``: ``{"path": folder, "version": n, "keep": k, "tag": tag}`` (a server started with
  ``--max-lora-rank``): load a LoRA policy's adapters of version ``n`` from their PEFT folder beside the resident
  base model, and unload the versions older than ``n - k + 1``; ``/generate`` and ``/score`` then name the version
  they sample or score with (``"adapter": n``; none: the base model), so every request says which adapters it uses;
  later requests name ``tag``.
- ``POST /reset_prefix_cache``: forget the cached prefixes (the trainer calls it before and after every rollout).
- ``POST /shutdown``: answer, then exit.

The engine runs in this one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), in a process group of its own; a watchdog
ends the group when the trainer that started it is gone (killed, crashed: the pipe only the trainer holds open
reaches end-of-file), so no server outlives its run. Started by ``ragen rollout serve`` (no lifeline), it runs until
SIGINT/SIGTERM or ``/shutdown``.

Two defects of vLLM 0.32's CPU path are worked around here: the tied output head keeps its old pre-packed weights
after an in-place reload (it is re-packed after every reload), and a seeded request whose prefill is split over
engine steps crashes the CPU sampler (chunked prefill is off, so a prefill is never split).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 512 * 1024 * 1024  # a batch of prompts as JSON; far above any rollout's


class WeightsConflict(Exception):
    """A request names weights the server no longer holds (answered 409)."""


class _State:
    """What the handlers share: the engine (once loaded), its lock and the server's status."""

    def __init__(self, token: str, settings: dict[str, Any] | None = None) -> None:
        self.token = token
        self.settings = settings or {}  # what /health reports of how the engine serves (dtype, LoRA)
        self.weights = f"start-{os.urandom(8).hex()}"  # the tag of the weights held: a restart holds another
        self.llm: Any = None
        self.state = "loading"
        self.error = ""
        self.lock = threading.Lock()  # one engine call at a time
        self.stop = threading.Event()
        self.adapters: dict[int, Any] = {}  # version -> its LoRARequest, while resident


STATE: _State
END_GROUP = False  # whether the server ends its whole process group when it stops (a trainer's server)


def _sampling_params(vllm: Any, spec: dict[str, Any]) -> Any:
    return vllm.SamplingParams(
        n=1,
        temperature=float(spec["temperature"]),
        top_p=float(spec.get("top_p", 1.0)),
        top_k=int(spec.get("top_k", 0)),
        max_tokens=int(spec["max_tokens"]),
        seed=None if spec.get("seed") is None else int(spec["seed"]),
        logprobs=0,  # the sampled token's own log-prob only
        stop_token_ids=[int(token) for token in spec.get("stop_token_ids", [])],
        detokenize=False,  # the trainer decodes with its own tokenizer
    )


def generate(body: dict[str, Any]) -> dict[str, Any]:
    """Sample one completion per prompt; token ids and the sampler's log-prob of each."""
    import vllm

    prompts, specs = body["prompts"], body["sampling"]
    if body.get("weights") is not None and body["weights"] != STATE.weights:
        raise WeightsConflict(
            "this server holds other weights than the client pushed last (it was restarted, or another run pushed its "
            "own): `ragen resume` pushes the run's weights again"
        )
    if len(prompts) != len(specs):
        raise ValueError(f"{len(prompts)} prompts but {len(specs)} sampling settings")
    requests = [{"prompt_token_ids": [int(token) for token in prompt]} for prompt in prompts]
    if body.get("salt"):
        for request in requests:
            request["cache_salt"] = str(body["salt"])
    params = [_sampling_params(vllm, spec) for spec in specs]
    outputs = STATE.llm.generate(requests, params, use_tqdm=False, lora_request=_adapter(body))
    answers = []
    for output in outputs:
        completion = output.outputs[0]
        tokens = [int(token) for token in completion.token_ids]
        positions = completion.logprobs or []
        logprobs = [float(positions[i][token].logprob) for i, token in enumerate(tokens)]
        answers.append({"token_ids": tokens, "logprobs": logprobs, "finish_reason": completion.finish_reason})
    return {"outputs": answers}


def score(body: dict[str, Any]) -> dict[str, Any]:
    """The model's log-prob of every token after the first of each sequence (temperature 1, nothing filtered)."""
    import vllm

    sequences = [[int(token) for token in sequence] for sequence in body["sequences"]]
    params = vllm.SamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    requests = [{"prompt_token_ids": s} for s in sequences]
    outputs = STATE.llm.generate(requests, params, use_tqdm=False, lora_request=_adapter(body))
    answers = []
    for sequence, output in zip(sequences, outputs, strict=True):
        positions = output.prompt_logprobs  # the first is None (no context)
        answers.append([float(positions[i][token].logprob) for i, token in enumerate(sequence) if i > 0])
    return {"logprobs": answers}


def _adapter(body: dict[str, Any]) -> Any:
    """The LoRARequest of the adapter version a request names (None: the base model); a version not resident is an
    error naming the resident ones."""
    version = body.get("adapter")
    if version is None:
        return None
    request = STATE.adapters.get(int(version))
    if request is None:
        raise ValueError(f"adapter version {version} is not loaded (resident: {sorted(STATE.adapters)})")
    return request


def load_adapter(body: dict[str, Any]) -> dict[str, Any]:
    """Load the adapters of version ``version`` from the PEFT folder ``path`` (read once, now: the folder may be
    replaced after), then unload the versions older than the last ``keep``."""
    from vllm.lora.request import LoRARequest

    started = time.perf_counter()
    STATE.weights = f"reloading-{os.urandom(8).hex()}"
    version, keep = int(body["version"]), int(body.get("keep", 1))
    old = STATE.adapters.pop(version, None)
    if old is not None:  # the same version again (a resume, a relabel): its new files replace the old
        STATE.llm.llm_engine.remove_lora(old.lora_int_id)
    request = LoRARequest(f"policy-v{version}", version + 1, str(body["path"]))  # vLLM's ids start at 1
    if not STATE.llm.llm_engine.add_lora(request):
        raise ValueError(f"vLLM did not load the adapters of version {version} from {body['path']}")
    STATE.adapters[version] = request
    for stale in [v for v in STATE.adapters if v <= version - keep]:
        STATE.llm.llm_engine.remove_lora(STATE.adapters.pop(stale).lora_int_id)
    STATE.llm.reset_prefix_cache()
    STATE.weights = str(body.get("tag") or f"unnamed-{os.urandom(8).hex()}")
    return {"seconds": time.perf_counter() - started, "resident": sorted(STATE.adapters)}


def _repack_output_head(worker: Any) -> int:
    """On the CPU, re-pack the (tied) output head from its reloaded weight; the reload leaves the old packing."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if head is None or getattr(head, "weight", None) is None or head.weight.numel() == 0:
        return 0
    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
    return 1


def load_weights(body: dict[str, Any]) -> dict[str, Any]:
    """Reload the weights in place from the Hugging Face export at ``path``."""
    started = time.perf_counter()
    STATE.weights = f"reloading-{os.urandom(8).hex()}"  # a reload that fails half-way holds no client's weights
    STATE.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(body["path"])})
    STATE.llm.collective_rpc(_repack_output_head)
    STATE.llm.reset_prefix_cache()
    STATE.weights = str(body.get("tag") or f"unnamed-{os.urandom(8).hex()}")
    return {"seconds": time.perf_counter() - started}


def reset_prefix_cache(body: dict[str, Any]) -> dict[str, Any]:
    """Forget every cached prefix (a rollout starts from an empty cache, so what it samples never depends on what
    was served before it)."""
    return {"reset": bool(STATE.llm.reset_prefix_cache())}


ROUTES = {
    "/generate": generate,
    "/score": score,
    "/load_weights": load_weights,
    "/load_adapter": load_adapter,
    "/reset_prefix_cache": reset_prefix_cache,
}


class Handler(BaseHTTPRequestHandler):
    """JSON in, JSON out; errors as ``{"error": ...}`` with a 4xx/5xx status."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would drown the log; errors are logged where they happen

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if self.path != "/health":
            self._answer(404, {"error": f"no such endpoint: {self.path}"})
            return
        digest = hashlib.sha256(STATE.token.encode()).hexdigest()
        health = {"state": STATE.state, "pid": os.getpid(), "token_digest": digest, "error": STATE.error}
        self._answer(200, {**health, **STATE.settings, "weights": STATE.weights})

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        if not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {STATE.token}"):
            self._answer(403, {"error": "wrong or missing token"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self._answer(413, {"error": f"request body length must be 0..{MAX_BODY_BYTES} bytes"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._answer(400, {"error": f"request body is not JSON: {exc}"})
            return
        if self.path == "/shutdown":
            self._answer(200, {"stopping": True})
            STATE.stop.set()
            return
        route = ROUTES.get(self.path)
        if route is None:
            self._answer(404, {"error": f"no such endpoint: {self.path}"})
            return
        if STATE.state != "ready":
            self._answer(503, {"error": f"the engine is {STATE.state}: {STATE.error}".rstrip(": ")})
            return
        try:
            with STATE.lock:
                answer = route(body)
        except WeightsConflict as exc:
            self._answer(409, {"error": str(exc)})
            return
        except Exception as exc:  # the trainer gets the error; the log gets the traceback
            traceback.print_exc()
            sys.stdout.flush()
            self._answer(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._answer(200, answer)


def _end_group(code: int) -> None:
    """Exit at once with everything this server started. Started by a trainer (``--lifeline-fd``), in a process group
    of its own that it (or a wrapper script before it) leads: the whole group, SIGKILLed. Started by ``ragen rollout
    serve``, whose group may hold a shell's pipeline: its own child processes (vLLM's workers), then itself with
    ``code``."""
    sys.stdout.flush()
    _save_coverage()
    try:
        if END_GROUP:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        for pid in _children(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    finally:
        os._exit(code)


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent``, and theirs (from /proc: vLLM's servers run on Linux)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [parent]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _save_coverage() -> None:
    """Under coverage.py (a re-stamp probe measuring the server program), save what it measured now: the group's
    SIGKILL below ends this process too, before any exit handler runs."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is not None:
        current.stop()
        current.save()


def _watch_trainer(lifeline: int) -> None:
    """End the server when the trainer that started it is gone: it alone holds the write end of the ``lifeline`` pipe,
    so a read returns end-of-file when it exits, however it ended (also through a wrapper script in between)."""
    while True:
        try:
            if not os.read(lifeline, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    print("vllm server: the trainer is gone; stopping", flush=True)
    _end_group(3)


def _build_engine(args: argparse.Namespace) -> Any:
    import vllm
    from vllm.platforms import current_platform

    options: dict[str, Any] = {}
    if args.kv_cache_gib is not None:
        options["kv_cache_memory_bytes"] = int(args.kv_cache_gib * 1024**3)
    elif current_platform.is_cpu():
        options["kv_cache_memory_bytes"] = 1024**3
    else:
        options["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.max_lora_rank:  # a LoRA policy: its adapters by version beside the resident base model
        options.update(enable_lora=True, max_lora_rank=args.max_lora_rank, max_loras=args.max_loras)
        options["max_cpu_loras"] = args.max_loras
    return vllm.LLM(
        model=args.model,
        tokenizer=args.model,
        skip_tokenizer_init=False,
        dtype=args.dtype,
        seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
        enforce_eager=args.enforce_eager,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.prefix_caching,  # later turns reuse the earlier turns' keys and values
        enable_chunked_prefill=False,  # a split prefill crashes seeded sampling on the CPU (vLLM 0.32)
        logprobs_mode="processed_logprobs",  # log-probs after temperature / top-k / top-p: the sampler's own
        generation_config="vllm",  # the model folder's sampling defaults change nothing
        **options,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="RAGEN-Flows' vLLM rollout server (a trainer or `ragen rollout serve`)"
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: one the OS picks)")
    parser.add_argument("--listen-fd", type=int, default=None, help="a listening socket to serve (instead of binding)")
    parser.add_argument("--ready-file", default=None, help="where to write the port and pid once listening")
    parser.add_argument("--lifeline-fd", type=int, default=None, help="a pipe's read end; end-of-file: stop")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=None, help="serve LoRA adapters up to this rank")
    parser.add_argument("--max-loras", type=int, default=1, help="adapter versions resident at once")
    return parser


def _listen(args: argparse.Namespace) -> ThreadingHTTPServer:
    """The HTTP server, serving in a thread: on the socket ``ragen rollout serve`` bound (it checked the address
    first), else bound here; its port written to the ready file of a trainer that waits for it."""
    server = ThreadingHTTPServer((args.host, args.port), Handler, bind_and_activate=args.listen_fd is None)
    if args.listen_fd is not None:
        server.socket.close()
        server.socket = socket.socket(fileno=args.listen_fd)
        server.server_address = server.socket.getsockname()
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.ready_file is not None:
        temporary = f"{args.ready_file}.{os.getpid()}.tmp"
        with open(temporary, "w") as handle:
            json.dump({"port": server.server_address[1], "pid": os.getpid()}, handle)
        os.replace(temporary, args.ready_file)
    return server


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    global STATE, END_GROUP
    served = {"dtype": args.dtype, "max_lora_rank": args.max_lora_rank, "max_loras": args.max_loras}
    STATE = _State(os.environ.pop("RAGEN_VLLM_TOKEN", ""), served)
    if not STATE.token:
        print(
            "vllm server: RAGEN_VLLM_TOKEN is not set (a trainer or `ragen rollout serve` starts it)", file=sys.stderr
        )
        return 2
    if args.lifeline_fd is not None:
        END_GROUP = True  # a trainer's server: its group is its own
        threading.Thread(target=_watch_trainer, args=(args.lifeline_fd,), daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: STATE.stop.set())
    server = _listen(args)
    print(f"vllm server: listening on {args.host}:{server.server_address[1]}, loading {args.model}", flush=True)

    try:
        STATE.llm = _build_engine(args)
        if args.max_lora_rank:
            print(f"vllm server: LoRA adapters up to rank {args.max_lora_rank}, {args.max_loras} version(s) resident")
        STATE.state = "ready"
        print("vllm server: ready", flush=True)
    except Exception as exc:
        traceback.print_exc()
        STATE.state, STATE.error = "failed", f"{type(exc).__name__}: {exc}"
    STATE.stop.wait()
    time.sleep(0.2)  # let the shutdown answer leave
    _end_group(0)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: one process to stop
    sys.exit(main())
