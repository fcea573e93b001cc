"""``ragen rollout serve``: a vLLM rollout server started on its own (another host, a Slurm step, a pod) for runs to
sample from with ``rollout.vllm.servers``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import typer

from ragen_cli.common import console, fail, shown, warn

rollout_app = typer.Typer(
    help="Rollout servers on other hosts: serve the policy with vLLM for runs to sample from (rollout.vllm.servers).",
    add_completion=False,
    no_args_is_help=True,
)
DTYPES = ("float32", "bfloat16", "float16")  # trainer.precision fp32, bf16, fp16


@rollout_app.command("serve")
def rollout_serve(
    model: Path = typer.Option(
        ...,
        "--model",
        help="A model folder of the run's architecture (its model.path): the run pushes its own weights into the "
        "server when it opens and after every update.",
    ),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (beyond loopback: reachable from the run's host)."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16: the run's trainer.precision."),
    max_lora_rank: int | None = typer.Option(
        None, "--max-lora-rank", help="Serve a LoRA policy's adapters up to this rank (1, 8, 16, 32, 64, ...)."
    ),
    max_loras: int = typer.Option(
        1, "--max-loras", help="Adapter versions resident at once (a LoRA run needs trainer.max_staleness + 1)."
    ),
    max_model_len: int | None = typer.Option(None, "--max-model-len", help="Longest sequence served."),
    kv_cache_gib: float | None = typer.Option(None, "--kv-cache-gib", help="KV cache size (CPU default: 1 GiB)."),
    gpu_memory_utilization: float = typer.Option(0.4, "--gpu-memory-utilization", help="Share of the GPU's memory."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help="GPUs the server shards over."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="Skip vLLM's compilation."),
    prefix_caching: bool = typer.Option(True, "--prefix-caching/--no-prefix-caching", help="Reuse earlier turns."),
    python: Path | None = typer.Option(
        None, "--python", help="Python of the vLLM environment (default: $RAGEN_VLLM_PYTHON, else .venv-vllm)."
    ),
) -> None:
    """Serve the policy with vLLM until Ctrl-C (or SIGTERM): a run lists this server's URL in rollout.vllm.servers
    and samples its share of each turn's requests here. The token in $RAGEN_ROLLOUT_TOKEN must be the run's. The
    run's data root and model folders must be readable here at the same paths (the run's weight pushes name them).
    It prints its URL; its log says "vllm server: ready" once the engine is loaded."""
    from ragen_core.rollout.vllm_backend import VLLM_LORA_RANKS
    from ragen_core.rollout.vllm_client import BackendUnavailable, rollout_token
    from ragen_core.rollout.vllm_local import SERVER_PROGRAM, server_arguments, server_environment, vllm_python
    from ragen_view.server import ViewError, bind

    problems = [
        f"--model {shown(str(model))} is no model folder (no config.json in it)"
        if not (model / "config.json").is_file()
        else "",
        f"--dtype must be one of {', '.join(DTYPES)}, not {shown(dtype)}" if dtype not in DTYPES else "",
        f"--max-lora-rank must be one of {', '.join(map(str, VLLM_LORA_RANKS))} (vLLM's), not {max_lora_rank}"
        if max_lora_rank is not None and max_lora_rank not in VLLM_LORA_RANKS
        else "",
        "--max-loras must be at least 1" if max_loras < 1 else "",
        "--tensor-parallel-size must be at least 1" if tensor_parallel_size < 1 else "",
        "--gpu-memory-utilization must be in (0, 1]" if not 0 < gpu_memory_utilization <= 1 else "",
        "--kv-cache-gib must be positive" if kv_cache_gib is not None and kv_cache_gib <= 0 else "",
        "--max-model-len must be positive" if max_model_len is not None and max_model_len <= 0 else "",
    ]
    if any(problems):
        fail("; ".join(problem for problem in problems if problem))
    if python is not None and not (python.is_file() and os.access(python, os.X_OK)):
        fail(f"--python {shown(str(python))} is not an executable Python (the vLLM environment's: make install-vllm)")
    try:
        token = rollout_token()
        program = vllm_python(str(python) if python is not None else None)
    except BackendUnavailable as exc:
        fail(str(exc))
    try:
        binding = bind(host, port)
    except ViewError as exc:
        fail(str(exc))
    url = f"http://{urlsplit(binding.url).netloc}"
    if not binding.loopback:
        warn(f"listening on {host}: anyone who can reach this machine and holds the token can drive this server")
    options = {
        "--model": model.resolve(),
        "--host": host,
        "--listen-fd": binding.sock.fileno(),
        "--dtype": dtype,
        "--tensor-parallel-size": tensor_parallel_size,
        "--gpu-memory-utilization": gpu_memory_utilization,
        "--max-model-len": max_model_len,
        "--kv-cache-gib": kv_cache_gib,
        "--enforce-eager": enforce_eager,
        "--prefix-caching": prefix_caching,
        "--max-lora-rank": max_lora_rank,
        "--max-loras": max_loras if max_lora_rank else None,
    }
    console.print(
        f"ragen rollout serve: {url}  (a run samples here with rollout.vllm.servers=[{url}]; ready once its log says "
        "'vllm server: ready'; Ctrl-C stops it)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    command = [str(program), "-I", str(SERVER_PROGRAM), *server_arguments(options)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, command, {**server_environment(), "RAGEN_VLLM_TOKEN": token})  # its signals are the server's


__all__ = ["rollout_app"]
