"""Asynchronous StarPO against the synchronous iteration at equal work (issue 50, item 6).

The same training run twice through the Python API (the run layer's own procedures, no Prefect in between), once
with ``trainer.max_staleness=0`` and once with ``trainer.max_staleness=k``: the same config, seeds, batch sizes and
iterations, so the same work. With k >= 1 the sampler process (the Hugging Face backend, ``rollout.sampler_threads``
threads) generates the next batch on one core while the learner updates on the other. Pairs run interleaved
(sync, async, async, sync, ...): each ratio's numerator and denominator come from neighbouring runs on the same
machine.

Per run: wall seconds per training step, from the progress callback's commit times (commit 0 .. commit m, where
m = iterations - 1 - k, so every async step measured samples a batch ahead; the sync side is measured over the same
steps), and each side's idle share over those steps: the learner's is 1 - update time / wall, the sampler's
1 - (generate + persist + validate + filter) / wall (in an async run the lane's stages of batch i ran during step
i - k; summed over the measured steps the shares are those of the whole stretch).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import spread
from benchmarks.models import model_dir

LANE = ("time/generate", "time/persist", "time/validate", "time/filter")


@dataclass(frozen=True)
class AsyncCase:
    """One pairing: the model shape, the env and its batch, the iterations of each run, the async side's staleness,
    the interleaved pairs, the data root and the torch threads of each side."""

    shape: str
    env: str
    groups: int
    group_size: int
    max_turns: int
    max_new_tokens: int
    iterations: int
    staleness: int
    pairs: int
    data_root: Path
    threads: int
    # the async side's actor.reuse_behavior_logprobs: "always" takes the sampler's stored log-probs as PPO's old
    # ones, as the sync side's "auto" does (equal work); "auto" re-scores the batch (one more forward per update)
    async_reuse: str = "auto"


def _config(case: AsyncCase, staleness: int) -> dict[str, Any]:
    return {
        "seed": 7,
        "model": {"path": str(model_dir(case.shape))},
        "env": {"name": case.env, "val_envs": [case.env], "max_turns": case.max_turns},
        "rollout": {
            "env_groups": case.groups,
            "group_size": case.group_size,
            "max_new_tokens": case.max_new_tokens,
            "sampler_threads": case.threads,
        },
        "actor": {
            "mini_batch_size": case.groups * case.group_size,
            "micro_batch_size": 8,
            "reuse_behavior_logprobs": case.async_reuse if staleness else "auto",
        },
        "algorithm": {"filter_ratio": 1.0},  # every group trained: the update's work does not depend on the batch
        "trainer": {
            "iterations": case.iterations,
            "max_staleness": staleness,
            "num_threads": case.threads,
            "checkpoint_every": 1000,
        },
        "eval": {"every": 1000, "instances": 2},
        "bootstrap": {"enabled": False},
        "monitor": {"truncated_share": None, "trackers": []},
    }


def run_once(case: AsyncCase, staleness: int, label: str) -> dict[str, float]:
    """One training run; its seconds per measured step and idle shares."""
    import ragen_core

    commits: list[tuple[int, float, dict[str, float]]] = []
    root = Path(tempfile.mkdtemp(prefix=f"async-{label}-", dir=case.data_root))
    ragen_core.train(
        _config(case, staleness),
        root,
        label,
        progress=lambda i, metrics: commits.append((i, time.perf_counter(), dict(metrics))),
    )
    last = case.iterations - 1 - case.staleness
    times = {i: t for i, t, _ in commits}
    metrics = {i: m for i, _, m in commits}
    wall = times[last] - times[0]
    steps = range(1, last + 1)
    update = sum(metrics[i].get("time/update", 0.0) for i in steps)
    if staleness:  # the lane of batch i ran during step i - k
        lane = sum(metrics[i + staleness].get(key, 0.0) for i in steps for key in LANE)
    else:
        lane = sum(metrics[i].get(key, 0.0) for i in steps for key in LANE)
    return {
        "seconds_per_step": wall / len(steps),
        "learner_idle_share": max(0.0, 1 - update / wall),
        "sampler_idle_share": max(0.0, 1 - lane / wall),
        "update_s": update / len(steps),
        "lane_s": lane / len(steps),
    }


# One process's share of a fixed CPU workload: an update-sized matmul chain on one torch thread.
WORKLOAD = """
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(256, 384), torch.randn(384, 1536)
started = time.perf_counter()
for _ in range({steps}):
    c = a @ b
    a = (c[:, :384] * 1e-3).contiguous()
print(time.perf_counter() - started)
"""


def parallel_capacity(repeats: int = 3, steps: int = 400) -> dict[str, Any]:
    """How much of two processes' work this machine does at once: the same one-thread workload in one process
    alone, then in two processes started together; capacity = 2 x (alone) / (together), interleaved ``repeats``
    times. 2.0: two independent cores; about 1.0-1.3: the two CPUs share a physical core (SMT siblings on the host)
    or its memory bandwidth. An async run cannot do better than what the machine runs at once: its best time per
    step is about max(update, generation) x 2 / capacity when the two are equal."""
    code = WORKLOAD.format(steps=steps)

    def timed(copies: int) -> float:
        started = time.perf_counter()
        processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(copies)]
        for process in processes:
            process.wait()
        return time.perf_counter() - started

    ratios = []
    for _ in range(repeats):
        alone, together = timed(1), timed(2)
        ratios.append(2 * alone / together)
    return spread(ratios)


def measure(case: AsyncCase) -> dict[str, Any]:
    """``case.pairs`` interleaved pairs; the async / sync ratio of seconds per step, and each side's shares."""
    sync_runs, async_runs = [], []
    for pair in range(case.pairs):
        order = (0, case.staleness) if pair % 2 == 0 else (case.staleness, 0)
        for staleness in order:
            result = run_once(case, staleness, f"{'async' if staleness else 'sync'}-{pair}")
            (async_runs if staleness else sync_runs).append(result)
    ratios = [a["seconds_per_step"] / s["seconds_per_step"] for a, s in zip(async_runs, sync_runs, strict=True)]

    def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
        return {key: spread([r[key] for r in runs]) for key in runs[0]}

    return {
        "case": {key: str(value) if isinstance(value, Path) else value for key, value in case.__dict__.items()},
        "parallel_capacity": parallel_capacity(),
        "ratio": spread(ratios),
        "sync": summary(sync_runs),
        "async": summary(async_runs),
    }
