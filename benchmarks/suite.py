"""The benchmark sections and their sizes (full and ``--quick``); each returns a JSON-able dict for the report."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import machine

TARGETS = {
    "rollout_efficiency": 0.9,  # at least
    "update_efficiency": 0.9,  # at least
    "orchestration_overhead": 0.05,  # at most, at the demo config
    "validation_share": 0.10,  # at most, at the demo config: the data contracts' share of an iteration
    "trl_iteration_time_ratio": 0.7,  # at most: ours / TRL's time per iteration at equal work (moonshot 0.5)
    "peak_rss_growth": 0.1,  # at most
    "vllm_speedup_multiturn": 8.0,  # at least: vLLM backend / HF backend tokens per second, multi-turn Sokoban, 20m
    "weight_push_share": 0.10,  # at most: a vLLM weight push's share of its iteration at the demo's size
    "launched_group_update_ratio": 1.2,  # at most: the launched group's update time / the in-process one, 20m
    "async_iteration_ratio": 0.7,  # at most: an async run's (max_staleness=1) time per step / the sync run's
    "view_page_s": 1.0,  # at most: the slowest browsing page of `ragen view` on a 1M-trajectory lake (median s)
}


@dataclass(frozen=True)
class Sizes:
    """How big each section runs."""

    rollout_cases: tuple[tuple[str, str, int, int, int], ...]  # (shape, case, groups, group_size, repeats)
    update_shapes: tuple[tuple[str, int], ...]  # (shape, repeats)
    repeats: int  # of anything without its own count
    common_overrides: tuple[str, ...]  # on every flow run and the peer run (the bootstrap must be the same)
    demo_overrides: tuple[str, ...]
    variant_iterations: int
    large_iterations: int
    peer_iterations: int
    peer_eval_every: int
    peer_eval_instances: int
    lake_turns: tuple[int, ...]
    lake_iterations: int
    vllm_cases: tuple[tuple[str, str, int, int, int], ...] = ()  # (shape, case, groups, group_size, repeats)
    vllm_push_overrides: tuple[str, ...] = ()  # the demo run whose weight pushes are timed
    repeats_override: int | None = None  # --repeats: every ratio
    group_shapes: tuple[tuple[str, int], ...] = ()  # (shape, repeats): launched group vs in-process update
    nodes_shapes: tuple[tuple[str, int], ...] = ()  # (shape, repeats): the group on two nodes vs one node of two ranks
    servers_cases: tuple[tuple[str, str, int, int, int], ...] = ()  # (shape, case, groups, group_size, repeats)
    # (shape, env, groups, group_size, max_turns, max_new_tokens, iterations, pairs, the async side's
    # actor.reuse_behavior_logprobs): async vs sync
    async_cases: tuple[tuple[str, str, int, int, int, int, int, int, str], ...] = ()
    view_trajectories: int = 0  # the rollout viewer's lake (2 runs x view_iterations)
    view_iterations: int = 50
    host_shapes: tuple[str, ...] = ()  # benchmarks/host_bench.py's shapes: the host's share, before and after
    host_iterations: int = 5
    host_pairs: int = 2
    lora_cases: tuple[tuple[str, int, int], ...] = ()  # (shape, pairs, repeats): LoRA vs full fine-tuning
    store_runs: tuple[int, int] = (3, 6)  # (repeats, iterations): the demo on a bucket vs a local folder


FULL = Sizes(
    rollout_cases=(
        ("tiny", "bandit", 8, 16, 5),  # the demo's batch
        ("tiny", "sokoban", 4, 8, 5),
        ("20m", "bandit", 4, 16, 3),
        ("20m", "sokoban", 1, 8, 3),  # ~25 s per repeat of both sides on 2 cores
    ),
    update_shapes=(("tiny", 5), ("20m", 3)),  # the 20m update: ~20 s per repeat of both sides
    repeats=5,
    common_overrides=(),
    demo_overrides=(),  # configs/bandit.yaml as `make demo` runs it: 30 iterations
    variant_iterations=10,
    large_iterations=3,
    peer_iterations=15,
    peer_eval_every=5,
    peer_eval_instances=64,
    lake_turns=(10_000, 100_000, 1_000_000),
    lake_iterations=50,
    vllm_cases=(
        ("tiny", "bandit", 8, 16, 3),  # the demo's batch, one turn
        ("tiny", "sokoban", 4, 8, 3),  # five turns
        ("20m", "bandit", 4, 16, 3),
        ("20m", "sokoban", 4, 8, 3),  # the target's case
    ),
    vllm_push_overrides=("trainer.iterations=8", "eval.every=4", "eval.instances=64"),
    group_shapes=(("20m", 3),),  # ~3 x 3 updates of ~10-20 s on 2 cores
    nodes_shapes=(("20m", 3),),  # two groups of two ranks, ~2 x 4 updates
    servers_cases=(("tiny", "sokoban", 4, 8, 3), ("20m", "sokoban", 4, 8, 3)),  # two vLLM servers vs one
    # multi-turn, ~3 min per run on 2 cores: first the target's case at equal work (the async side takes the stored
    # log-probs as PPO's old ones, as the sync side does), then the async side re-scoring its batch (its default:
    # one more forward per update, what the decoupled correction needs too)
    async_cases=(("20m", "sokoban", 4, 4, 3, 48, 6, 2, "always"), ("20m", "sokoban", 4, 4, 3, 48, 6, 2, "auto")),
    view_trajectories=1_000_000,  # issue 52's lake: a page in under a second
    host_shapes=("demo", "sokoban", "sokoban_turn_rows"),  # ~1 min per pair of runs on 2 cores
    lora_cases=(("20m", 2, 3),),  # three sides (full, rank 8, rank 32) x 2 processes, ~1 min each on 2 cores
)
QUICK = Sizes(
    rollout_cases=(("tiny", "bandit", 2, 8, 3), ("tiny", "sokoban", 1, 4, 3)),
    update_shapes=(("tiny", 3),),
    repeats=3,
    common_overrides=("bootstrap.num_groups=16", "bootstrap.epochs=2"),
    demo_overrides=("trainer.iterations=6", "eval.every=3", "eval.instances=16"),
    variant_iterations=3,
    large_iterations=2,
    peer_iterations=3,
    peer_eval_every=3,
    peer_eval_instances=16,
    lake_turns=(10_000,),
    lake_iterations=10,
    vllm_cases=(("tiny", "bandit", 2, 8, 3), ("tiny", "sokoban", 1, 4, 3)),
    vllm_push_overrides=("trainer.iterations=3", "eval.every=3", "eval.instances=16"),
    group_shapes=(("tiny", 3),),
    nodes_shapes=(("tiny", 3),),
    servers_cases=(("tiny", "bandit", 2, 8, 3),),
    async_cases=(("tiny", "sokoban", 2, 4, 3, 16, 4, 3, "always"),),
    view_trajectories=10_000,
    view_iterations=5,
    host_shapes=("demo",),
    host_iterations=3,
    host_pairs=1,
    lora_cases=(("tiny", 1, 2),),
    store_runs=(1, 2),
)
GPU_ROLLOUT_CASES = (("0.5b", "bandit", 8, 16, 5), ("0.5b", "sokoban", 8, 16, 5))
SECTIONS = (
    "flow",
    "peer",
    "rollout",
    "update",
    "group",
    "nodes",
    "lora",
    "async",
    "host",
    "lake",
    "view",
    "vllm",
    "servers",
    "store",
)


def _stamp(device: str) -> dict[str, Any]:
    return {"machine": machine(device), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run_flow_section(sizes: Sizes, data_root: Path, threads: int) -> dict[str, Any]:
    """Items 3, 4 (Parquet share) and 6: the demo config (30 iterations, memory sampled), the previous design
    (iteration = a subflow, records introspected by Prefect) for comparison, and a 10x larger batch."""
    from benchmarks.flow_bench import FlowCase, memory_summary, overhead_summary, run_flow

    started = time.perf_counter()
    base = (f"trainer.num_threads={threads}", *sizes.common_overrides)
    demo_rows, demo_final = run_flow(FlowCase("demo", (*base, *sizes.demo_overrides), data_root), sample_memory=True)
    small_eval = ("eval.instances=16", "eval.every=1000")
    variant = (*base, f"trainer.iterations={sizes.variant_iterations}", *small_eval)
    variant_rows, _ = run_flow(FlowCase("variant", variant, data_root), variant=True)
    large = (*base, "rollout.env_groups=80", f"trainer.iterations={sizes.large_iterations}", *small_eval)
    large_rows, _ = run_flow(FlowCase("10x", large, data_root))
    return {
        **_stamp("cpu"),
        "threads": threads,
        "demo": {**overhead_summary(demo_rows), "rows": demo_rows, "final": demo_final},
        "memory": memory_summary(demo_rows),
        "variant": {**overhead_summary(variant_rows), "rows": variant_rows},
        "large": {**overhead_summary(large_rows), "rows": large_rows},
        "seconds": time.perf_counter() - started,
    }


def run_peer_section(sizes: Sizes, data_root: Path, threads: int) -> dict[str, Any]:
    """Item 5: TRL's GRPOTrainer and our train flow, interleaved per iteration, in two pairings: equal work (our
    variance filter off) and our recommended StarPO-S demo config."""
    try:
        import trl  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "TRL is not installed: `make bench` installs it (the `bench` extra: pip install -e '.[bench]' "
            "-c constraints-cpu.txt)"
        ) from None
    from benchmarks.trl_bench import PeerCase, measure

    started = time.perf_counter()
    pairings = {}
    for name, ratio in (("equal_work", 1.0), ("starpo_s", 0.25)):
        case = PeerCase(
            sizes.peer_iterations,
            sizes.peer_eval_every,
            sizes.peer_eval_instances,
            data_root,
            threads,
            ratio,
            sizes.common_overrides,
        )
        pairings[name] = measure(case)
    return {**_stamp("cpu"), "threads": threads, **pairings, "seconds": time.perf_counter() - started}


def run_rollout_section(sizes: Sizes, device: str, threads: int) -> dict[str, Any]:
    """Item 1 (CPU) or 7 (cuda): our rollout engine against bare ``model.generate``."""
    import torch

    from benchmarks.models import load, parameter_count
    from benchmarks.rollout_bench import RolloutCase, measure

    started = time.perf_counter()
    cases = GPU_ROLLOUT_CASES if device == "cuda" else sizes.rollout_cases
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    results, params = [], {}
    for shape in dict.fromkeys(case[0] for case in cases):
        model, tokenizer = load(shape, device, dtype)
        params[shape] = parameter_count(model)
        for case_shape, case, groups, group_size, repeats in cases:
            if case_shape == shape:
                repeats = sizes.repeats_override or repeats
                results.append(measure(RolloutCase(shape, case, groups, group_size, repeats), model, tokenizer))
        del model
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        **_stamp(device),
        "threads": threads,
        "dtype": dtype_name,
        "parameters": params,
        "cases": results,
        "seconds": time.perf_counter() - started,
    }


def run_update_section(sizes: Sizes, device: str, threads: int, peak_tflops: float | None) -> dict[str, Any]:
    """Item 2 (CPU) or 7 (cuda, with the update's model FLOPs utilisation)."""
    from benchmarks.models import model_dir
    from benchmarks.peak import update_peak_share
    from benchmarks.update_bench import UpdateCase, measure
    from ragen_core.training.cost import matmul_peak_tflops  # the same measurement as a run's perf/mfu

    started = time.perf_counter()
    shapes = (("0.5b", 5),) if device == "cuda" else sizes.update_shapes
    peaks = [matmul_peak_tflops(device)]  # before and after the cases: the best of both is the peak
    results = [
        measure(UpdateCase(shape, model_dir(shape), sizes.repeats_override or repeats, threads, device))
        for shape, repeats in shapes
    ]
    peaks.append(matmul_peak_tflops(device))
    for result in results:
        result["peak_share"] = update_peak_share(result, max(peaks))
        if device == "cuda":
            result["mfu"] = update_mfu(result, peak_tflops)
    return {
        **_stamp(device),
        "threads": threads,
        "cases": results,
        "matmul_peak_tflops": peaks,
        "seconds": time.perf_counter() - started,
    }


def run_group_section(sizes: Sizes, threads: int) -> dict[str, Any]:
    """Item 3 of issue 41: the launched update group (torchrun, one process) against the in-process update, same
    batch, same threads, interleaved; and the group with the export hand-off it used before."""
    from benchmarks.group_bench import GroupCase, measure

    return _shape_cases(
        sizes.group_shapes, lambda shape, repeats: measure(GroupCase(shape, repeats, threads)), sizes, threads
    )


def run_nodes_section(sizes: Sizes, threads: int) -> dict[str, Any]:
    """Issue 70, item 6: the update group on two nodes (node 1 joined by `ragen group join`) against one node of two
    ranks, same batch, same threads, interleaved; and whether both end with the same weights."""
    from benchmarks.nodes_bench import NodesCase, measure

    return _shape_cases(
        sizes.nodes_shapes, lambda shape, repeats: measure(NodesCase(shape, repeats, threads)), sizes, threads
    )


def _shape_cases(shapes: tuple[tuple[str, int], ...], measure: Any, sizes: Sizes, threads: int) -> dict[str, Any]:
    """A section of one measurement per (shape, repeats), --repeats overriding the repeats, with its machine."""
    started = time.perf_counter()
    cases = [measure(shape, sizes.repeats_override or repeats) for shape, repeats in shapes]
    return {**_stamp("cpu"), "threads": threads, "cases": cases, "seconds": time.perf_counter() - started}


def run_lora_section(sizes: Sizes, threads: int) -> dict[str, Any]:
    """Issue 69, item 4: LoRA adapters (ranks 8 and 32, every linear layer) against full fine-tuning on one real
    batch: trainable parameters, optimizer-state bytes, update tokens/s, sampling seconds, peak RSS (each side in a
    process of its own)."""
    from benchmarks.lora_bench import measure

    started = time.perf_counter()
    cases = [
        measure(shape, pairs, sizes.repeats_override or repeats, threads) for shape, pairs, repeats in sizes.lora_cases
    ]
    return {**_stamp("cpu"), "threads": threads, "cases": cases, "seconds": time.perf_counter() - started}


# Dense bf16 peak of common GPUs (TFLOP/s, no sparsity), from the vendors' data sheets.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}


def update_mfu(result: dict[str, Any], peak_tflops: float | None) -> dict[str, Any]:
    """Model FLOPs utilisation of our update: 6 x parameters x processed tokens per training pass (forward +
    backward) plus 2 x parameters x tokens for the re-scoring forward, over the median time and the GPU's peak."""
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    peak = peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    flops = 8 * result["parameters"] * result["processed_tokens"]
    seconds = sorted(result["ours_seconds"])[len(result["ours_seconds"]) // 2]
    achieved = flops / seconds / 1e12
    return {"achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak if peak else None}


def run_vllm_section(sizes: Sizes, data_root: Path, threads: int) -> dict[str, Any]:
    """vLLM backend vs Hugging Face backend vs bare generate (1 and 5 turns, tiny and 20m), the server's start, and a
    weight push's share of its iteration at the demo's size (needs `make install-vllm`)."""
    from benchmarks.vllm_bench import VLLMCase, run

    started = time.perf_counter()
    cases = [
        VLLMCase(shape, case, groups, size, sizes.repeats_override or repeats)
        for shape, case, groups, size, repeats in sizes.vllm_cases
    ]
    result = run(cases, data_root, (*sizes.common_overrides, *sizes.vllm_push_overrides), threads)
    return {**_stamp("cpu"), "threads": threads, **result, "seconds": time.perf_counter() - started}


def run_servers_section(sizes: Sizes, data_root: Path, threads: int) -> dict[str, Any]:
    """Issue 70, item 6: rollouts on two vLLM servers against one at equal work (groups per second, the same rows),
    and a weight push to two servers against one (its share of the iteration); needs `make install-vllm`."""
    from benchmarks.servers_bench import ServersCase, run

    started = time.perf_counter()
    cases = [
        ServersCase(shape, case, groups, size, sizes.repeats_override or repeats)
        for shape, case, groups, size, repeats in sizes.servers_cases
    ]
    result = run(cases, data_root, (*sizes.common_overrides, *sizes.vllm_push_overrides), threads)
    return {**_stamp("cpu"), "threads": threads, **result, "seconds": time.perf_counter() - started}


def run_store_section(sizes: Sizes, threads: int) -> dict[str, Any]:
    """Issue 71, item 6: the demo's iterations with the data root on a local S3-compatible server against a local
    folder (interleaved whole runs), and `ragen sql`'s query time on both."""
    from benchmarks.store_bench import run

    started = time.perf_counter()
    repeats, iterations = sizes.store_runs
    work = Path(tempfile.mkdtemp(prefix="store-bench-"))
    try:
        result = run(sizes.repeats_override or repeats, iterations, threads, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**_stamp("cpu"), "threads": threads, **result, "seconds": time.perf_counter() - started}


def run_async_section(sizes: Sizes, data_root: Path, threads: int) -> dict[str, Any]:
    """Issue 50, item 6: asynchronous StarPO (max_staleness=1, the sampler process on one core) against the
    synchronous iteration, equal work, interleaved pairs of whole training runs."""
    from benchmarks.async_bench import AsyncCase, measure

    started = time.perf_counter()
    cases = []
    for shape, env, groups, size, turns, tokens, iterations, pairs, reuse in sizes.async_cases:
        pairs = sizes.repeats_override or pairs
        case = AsyncCase(shape, env, groups, size, turns, tokens, iterations, 1, pairs, data_root, threads, reuse)
        cases.append(measure(case))
    return {**_stamp("cpu"), "threads": threads, "cases": cases, "seconds": time.perf_counter() - started}


def run_host_section(sizes: Sizes, data_root: Path) -> dict[str, Any]:
    """Issue 49, item 3: the host's share of an iteration before and after the one token path, interleaved pairs of
    whole training runs at the demo's and multi-turn Sokoban's shapes."""
    from benchmarks.host_bench import HostCase, run_host

    started = time.perf_counter()
    pairs = sizes.repeats_override or sizes.host_pairs
    result = run_host(HostCase(sizes.host_shapes, sizes.host_iterations, pairs, data_root))
    return {**_stamp("cpu"), **result, "seconds": time.perf_counter() - started}


def run_lake_section(sizes: Sizes) -> dict[str, Any]:
    """Item 4: DuckDB time of the documented queries at each size (the largest also compacted)."""
    from benchmarks.lake_bench import measure

    started = time.perf_counter()
    by_size = {}
    for turns in sizes.lake_turns:
        largest = turns == max(sizes.lake_turns)
        by_size[str(turns)] = measure(turns, sizes.lake_iterations, compact=largest)
    return {**_stamp("cpu"), "sizes": by_size, "seconds": time.perf_counter() - started}


def run_view_section(sizes: Sizes) -> dict[str, Any]:
    """Issue 52: the time of each page of ``ragen view`` on a synthetic lake of ``view_trajectories``."""
    from benchmarks.view_bench import measure

    started = time.perf_counter()
    result = measure(sizes.view_trajectories, sizes.view_iterations, repeat=sizes.repeats)
    return {**_stamp("cpu"), **result, "seconds": time.perf_counter() - started}


def prefect_home(data_root: Path) -> None:
    """Prefect's temporary server gets a home of its own under the benchmark's data root (set before import)."""
    home = data_root / "_prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PREFECT_HOME"] = str(home)
