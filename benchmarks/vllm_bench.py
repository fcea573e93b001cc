"""vLLM rollouts, side by side in one run: generated tokens per second of our rollout engine with the vLLM backend,
with the Hugging Face backend, and of bare ``model.generate`` on the prompts the Hugging Face run issued; the vLLM
server's start; the time of a weight push (the trainer's export, the server's in-place reload, the check) against
the iteration it belongs to, at the demo's size.

All three rollout sides run the same spec, seeds and sampling settings (temperature 1, no top-k/top-p) on the same
model; vLLM samples with its own random streams, so its tokens differ from the Hugging Face sides' (the Hugging Face
backend and bare generate sample the same tokens, as in the rollout section). The server keeps one torch thread (vLLM
on 2 cores) and the benchmark process runs with ``--threads`` (1 by default): one thread each side.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import interleave, ratio_of_rates, spread
from benchmarks.rollout_bench import CASES, BareGenerate, _Recorder, spec_for
from ragen_core.agent import ChatFormatter
from ragen_core.rollout import run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.vllm_backend import VLLMBackend
from ragen_core.rollout.vllm_local import VLLMServer, vllm_python


@dataclass(frozen=True)
class VLLMCase:
    """One side-by-side measurement: a model shape, an environment case (1 or 5 turns) and the batch."""

    shape: str
    case: str
    groups: int
    group_size: int
    repeats: int
    seed: int = 0


def start_server(model_dir: Path, folder: Path) -> tuple[VLLMServer, float]:
    """A server on ``model_dir`` as runs start it (compiled); and the seconds until it was ready."""
    started = time.perf_counter()
    server = VLLMServer.start(vllm_python(), model_dir, folder)
    return server, time.perf_counter() - started


def measure(case: VLLMCase, server: VLLMServer, model: Any, tokenizer: Any) -> dict[str, Any]:
    """Interleaved repeats of the vLLM backend, the Hugging Face backend and bare generate on one case."""
    max_new_tokens = CASES[case.case][4]
    spec = spec_for(case.case, case.groups, case.group_size, case.seed)
    formatter = ChatFormatter(tokenizer)
    hf = HFBackend(model, tokenizer, 1.0, max_new_tokens, batch_size=case.groups * case.group_size)
    recorder = _Recorder(hf)
    run_rollouts(spec, recorder, formatter, case.seed)  # records the prompts; also warms up
    bare = BareGenerate(model, tokenizer, recorder.calls, max_new_tokens)
    vllm = VLLMBackend(server, tokenizer, 1.0, max_new_tokens)
    run_rollouts(spec, vllm, formatter, case.seed)  # warm-up

    def with_backend(backend: Any) -> Any:
        def side() -> int:
            return sum(r.response_length for r in run_rollouts(spec, backend, formatter, case.seed))

        return side

    timings = interleave({"vllm": with_backend(vllm), "hf": with_backend(hf), "bare": bare}, case.repeats)
    rates = {side: [tokens / seconds for seconds, tokens in runs] for side, runs in timings.items()}
    return {
        "shape": case.shape,
        "case": case.case,
        "turns": len(recorder.calls),
        "batch": case.groups * case.group_size,
        "max_new_tokens": max_new_tokens,
        **{f"{side}_seconds": [s for s, _ in runs] for side, runs in timings.items()},
        **{f"{side}_tokens": sorted({t for _, t in runs}) for side, runs in timings.items()},
        **{f"{side}_tokens_per_s": spread(values) for side, values in rates.items()},
        "vllm_over_hf": ratio_of_rates(rates["vllm"], rates["hf"]),
        "vllm_over_bare": ratio_of_rates(rates["vllm"], rates["bare"]),
    }


def measure_push(data_root: Path, overrides: tuple[str, ...], threads: int) -> dict[str, Any]:
    """A real run of the demo config with ``rollout.backend=vllm``: the seconds of every weight push (the updater's
    sync: the export, the server's reload and the check) against the wall time of its iteration."""
    import ragen_core.training.updater as updater_module
    from benchmarks.common import patched
    from benchmarks.flow_bench import FlowCase, run_flow

    pushes: list[float] = []
    original = updater_module.InProcessUpdater.sync

    def timed_sync(self: Any, rollout: Any) -> None:
        started = time.perf_counter()
        original(self, rollout)
        if getattr(rollout.sampler, "server", None) is not None:  # the vLLM sampler (ragen_core.rollout.samplers)
            pushes.append(time.perf_counter() - started)

    case = FlowCase("vllm-demo", (f"trainer.num_threads={threads}", "rollout.backend=vllm", *overrides), data_root)
    with patched(updater_module.InProcessUpdater, "sync", timed_sync):
        rows, final = run_flow(case)
    updated = [row for row in rows if row["trained_tokens"] > 0]  # one push each, in order
    if len(updated) != len(pushes):
        raise RuntimeError(f"{len(pushes)} weight pushes for {len(updated)} updated iterations")
    pairs = [(push, row) for push, row in zip(pushes, updated, strict=True) if not row["evaluated"]]
    trained = [row for _, row in pairs]
    shares = [push / row["wall_s"] for push, row in pairs]
    return {
        "push_seconds": spread(pushes) if pushes else None,
        "iteration_wall_s": spread([row["wall_s"] for row in trained]) if trained else None,
        "push_share": spread(shares) if shares else None,
        "iterations": len(rows),
        "final": final,
    }


def run(cases: list[VLLMCase], data_root: Path, push_overrides: tuple[str, ...], threads: int) -> dict[str, Any]:
    """Every case, one server per model shape (its start timed), then the weight push at the demo's size."""
    from benchmarks.models import load, model_dir, parameter_count

    results, starts, params = [], {}, {}
    for shape in dict.fromkeys(case.shape for case in cases):
        model, tokenizer = load(shape)
        params[shape] = parameter_count(model)
        server, starts[shape] = start_server(model_dir(shape), Path(tempfile.mkdtemp(prefix="vllm-bench-")))
        try:
            results.extend(measure(case, server, model, tokenizer) for case in cases if case.shape == shape)
        finally:
            server.close()
        del model
    return {
        "cases": results,
        "engine_start_s": starts,
        "parameters": params,
        "push": measure_push(data_root, push_overrides, threads),
    }
