"""LoRA adapters (``actor.lora``) against full fine-tuning: what the update costs in memory and time.

Each side runs in a process of its own (its peak RSS is then its own): it opens a session of configs/bandit.yaml on
the case's model (full fine-tuning, or LoRA of a rank on every linear layer), samples, persists, validates and
filters one real batch as the flow's stages do (at version 0 a LoRA policy is its base exactly, so both sides
train on the same rows: the bench checks the trained token counts agree), then times ``repeats`` updates of that
batch with the update stage's own call (:func:`ragen_core.run.stages.update_policy`). It reports the trainable
parameters, the optimizer state's bytes (AdamW's two moments of every trainable parameter, read from the engine's
optimizer), the update's trained tokens per second, the sampling stage's seconds (the rollouts' generation through
the adapters) and the process's peak RSS. Then the hand-off an async run makes after every update: the updated
policy into a sampler process of its own (:class:`ragen_core.rollout.sampler.SamplerProcess`; a LoRA policy hands
over its adapters alone), timed ``repeats`` times, with its bytes and its share of an iteration (the hand-off's
median over the sampling stages' seconds plus the update's median). The sides run alternately, ``pairs`` times
each; ratios are of medians.

    python -m benchmarks.lora_bench --shape 20m --pairs 2 --repeats 3

``make bench`` runs it as the ``lora`` section.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, spread

SIDES = {"full": None, "lora-8": 8, "lora-32": 32}  # side -> LoRA rank (None: every weight trained)


def _optimizer_state_bytes(optimizer: Any) -> int:
    """The bytes of every tensor in the optimizer's state (AdamW: exp_avg and exp_avg_sq per trained parameter)."""
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed wraps the torch optimizer
    return sum(
        value.numel() * value.element_size()
        for state in inner.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )


def run_side(side: str, model_dir: Path, repeats: int, threads: int) -> dict[str, Any]:
    """One side in this process: a real batch, then ``repeats`` timed updates of it (after one warm-up)."""
    from benchmarks.update_bench import make_batch
    from ragen_core.run import stages
    from ragen_core.run.checks import load_run_config
    from ragen_core.run.iteration import IterationState
    from ragen_core.run.session import open_session
    from ragen_core.storage import DataLake

    rank = SIDES[side]
    overrides = [f"model.path={model_dir}", "bootstrap.enabled=false", f"trainer.num_threads={threads}"]
    if rank is not None:
        overrides += [f"actor.lora.rank={rank}", f"actor.lora.alpha={2 * rank}"]
    config = load_run_config(ROOT / "configs" / "bandit.yaml", overrides)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as root:
        session = open_session(config, DataLake(root), f"lora-bench-{side}", model_dir)
        try:
            started = time.perf_counter()
            make_batch(session, 0)
            sampling = time.perf_counter() - started
            actor = session.updater.actor
            trainable = sum(p.numel() for p in actor.module.parameters() if p.requires_grad)
            tokens = int(stages.update_policy(session, 0, IterationState())["actor/trained_tokens"])  # warm-up
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                stages.update_policy(session, 0, IterationState())
                seconds.append(time.perf_counter() - started)
            state_bytes = _optimizer_state_bytes(actor.engine.optimizer)
            handoff_seconds, handoff_bytes = _handoff(actor.module, model_dir, repeats, Path(root))
        finally:
            session.close()
    return {
        "side": side,
        "rank": rank,
        "trainable_parameters": trainable,
        "optimizer_state_bytes": state_bytes,
        "trained_tokens": tokens,
        "update_seconds": seconds,
        "sampling_seconds": sampling,
        "handoff_seconds": handoff_seconds,
        "handoff_bytes": handoff_bytes,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _handoff(module: Any, model_dir: Path, repeats: int, folder: Path) -> tuple[list[float], int]:
    """``repeats`` timed hand-offs of ``module`` to a sampler process (after one untimed): their seconds, and the bytes
    each copies (the shared buffer: the adapters alone for a LoRA policy)."""
    from ragen_core.rollout import NewWeights
    from ragen_core.rollout.sampler import SamplerProcess

    sampler = SamplerProcess.start(model_dir, module, 1, folder / "sampler.log")
    try:
        sampler.load(NewWeights(module, version=1))
        seconds = []
        for version in range(2, repeats + 2):
            started = time.perf_counter()
            sampler.load(NewWeights(module, version=version))
            seconds.append(time.perf_counter() - started)
        return seconds, sampler.shared.layout.nbytes
    finally:
        sampler.close()


def measure(shape: str, pairs: int, repeats: int, threads: int) -> dict[str, Any]:
    """Every side ``pairs`` times, alternately, each in a fresh process; medians and ratios against full."""
    from benchmarks.models import model_dir, parameter_count

    folder = model_dir(shape)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for _ in range(pairs):
        for side in SIDES:
            command = [sys.executable, "-m", "benchmarks.lora_bench", "--side", side, "--model-dir", str(folder)]
            command += ["--repeats", str(repeats), "--threads", str(threads)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"lora bench side {side} failed: {done.stderr[-2000:]}")
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    tokens = {run["trained_tokens"] for side in runs.values() for run in side}
    if len(tokens) != 1:
        raise RuntimeError(f"the sides trained on different batches: trained tokens {sorted(tokens)}")
    from ragen_core.policy import load_policy

    result: dict[str, Any] = {"shape": shape, "parameters": parameter_count(load_policy(folder)[0])}
    result.update(trained_tokens=tokens.pop(), pairs=pairs, repeats=repeats, sides={})
    for side, done in runs.items():
        rates = [done[0]["trained_tokens"] / s for run in done for s in run["update_seconds"]]
        result["sides"][side] = {
            "rank": done[0]["rank"],
            "trainable_parameters": done[0]["trainable_parameters"],
            "optimizer_state_bytes": done[0]["optimizer_state_bytes"],
            "update_tokens_per_s": spread(rates),
            "update_seconds": [s for run in done for s in run["update_seconds"]],
            "sampling_seconds": spread([run["sampling_seconds"] for run in done]),
            "handoff_seconds": spread([s for run in done for s in run["handoff_seconds"]]),
            "handoff_bytes": done[0]["handoff_bytes"],
            "peak_rss_mib": spread([run["peak_rss_mib"] for run in done]),
        }
    full = result["sides"]["full"]
    for numbers in result["sides"].values():
        speed = numbers["update_tokens_per_s"]["median"]
        numbers["update_speed_vs_full"] = speed / full["update_tokens_per_s"]["median"]
        numbers["peak_rss_vs_full"] = numbers["peak_rss_mib"]["median"] / full["peak_rss_mib"]["median"]
        numbers["optimizer_state_vs_full"] = numbers["optimizer_state_bytes"] / full["optimizer_state_bytes"]
        iteration = numbers["sampling_seconds"]["median"] + statistics.median(numbers["update_seconds"])
        numbers["handoff_share"] = numbers["handoff_seconds"]["median"] / iteration
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lora_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=sorted(SIDES), help="Run one side in this process (the bench's own use).")
    parser.add_argument("--model-dir", type=Path, help="With --side: the model folder.")
    parser.add_argument("--shape", default="20m", help="The model shape (benchmarks/models.py).")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(run_side(args.side, args.model_dir, args.repeats, args.threads)))
    else:
        print(json.dumps(measure(args.shape, args.pairs, args.repeats, args.threads), indent=1))


if __name__ == "__main__":
    main()
