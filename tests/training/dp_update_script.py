"""Actor and critic updates on a fixed batch; run by tests/training/test_distributed.py in one process and under
``torchrun`` (``python -m torch.distributed.run --nproc_per_node 2 tests/training/dp_update_script.py MODEL OUT
STAGES``, STAGES e.g. ``2,3``): for each ZeRO stage in turn, in the same group, rank 0 saves the resulting weights
and metrics to ``OUT/zero<stage>.pt`` and the first actor is exported (every rank taking part) to the folder
``OUT/export-zero<stage>``. One group for all stages: its processes' start-up (~20 CPU-s) is paid once."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ragen_core.algos import grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig, CriticConfig
from ragen_core.training import ActorEngine, CriticEngine, OptimConfig, ValueModel, collate
from ragen_core.training.checkpoint import export_policy
from ragen_core.update.advantages import trajectory_token_rewards

# (name, optimizer, lr, loss aggregation, KL coefficient): 8 rows in micro-batches of 3 -> 3 micro-batches per
# mini-batch, so with 2 ranks one rank runs a zero-weight padding pass; 2 PPO epochs -> 2 optimizer steps.
ACTOR_CASES = [
    ("sgd-token-mean-kl", "sgd", 0.5, "token-mean", 0.05),
    ("sgd-seq-mean", "sgd", 0.5, "seq-mean-token-mean", 0.0),
    ("adamw-token-mean", "adamw", 1e-3, "token-mean", 0.0),
]
MICRO_BATCH = 3


def fixed_batch(pad_token_id: int):
    """Eight one-turn chats of different lengths in two groups, with scores of both signs of advantage."""
    generator = torch.Generator().manual_seed(0)
    ids, masks = [], []
    for row in range(8):
        prompt, response = 4 + row % 3, 3 + row % 4
        ids.append(torch.randint(10, 300, (prompt + response,), generator=generator).tolist())
        masks.append([0] * prompt + [1] * response)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.0, 0.9, 0.3, 0.1])
    return collate(ids, masks, pad_token_id), scores, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def run_cases(
    model: torch.nn.Module, tokenizer: Any, zero_stage: int, export_dir: Path | None = None
) -> dict[str, dict]:
    """Every actor case and one critic update from ``model``; the weights (on the CPU) and the metrics of each.
    ``export_dir``: also export the first actor as the rollout side's Hugging Face folder (a collective)."""
    pad_token_id = tokenizer.pad_token_id
    batch, scores, groups = fixed_batch(pad_token_id)
    advantages, returns = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    results = {}
    for name, optimizer, lr, agg, kl_coef in ACTOR_CASES:
        optim = OptimConfig(lr, 0.0, 1.0, MICRO_BATCH, zero_stage=zero_stage, optimizer=optimizer)
        actor = ActorEngine(copy.deepcopy(model), optim, keep_reference=kl_coef > 0)
        algorithm = AlgorithmConfig(
            policy_loss="ppo",
            clip_low=0.2,
            clip_high=0.28,
            kl_coef=kl_coef,
            entropy_coef=0.001,
            loss_agg_mode=agg,
            kl_estimator="low_var_kl",
        )
        reference = actor.score(batch, actor.reference) if kl_coef > 0 else None
        schedule = ActorConfig(mini_batch_size=8, ppo_epochs=2)
        metrics = actor.policy_update(batch, advantages, actor.score(batch), algorithm, schedule, 0, reference)
        results[name] = {"weights": _weights(actor.engine), "metrics": metrics}
        if export_dir is not None and name == ACTOR_CASES[0][0]:
            export_policy(actor, tokenizer, export_dir)
    optim = OptimConfig(0.5, 0.0, 1.0, MICRO_BATCH, zero_stage=zero_stage, optimizer="sgd")
    critic = CriticEngine(ValueModel.from_policy(copy.deepcopy(model)), optim)
    algorithm, schedule = AlgorithmConfig(loss_agg_mode="token-mean"), CriticConfig(mini_batch_size=8, ppo_epochs=2)
    metrics = critic.update(batch, critic.values(batch), returns, batch.loss_mask, algorithm, schedule, 0)
    results["critic"] = {"weights": _weights(critic.engine), "metrics": metrics}
    return results


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter, whole, on the CPU (under ZeRO-3 gathered from the ranks' partitions: a collective)."""
    import deepspeed

    parameters = list(engine.module.parameters())
    gather = deepspeed.zero.GatheredParameters(parameters) if engine.zero_optimization_partition_weights() else None
    with gather or contextlib.nullcontext():
        return {name: p.detach().to("cpu", copy=True) for name, p in engine.module.named_parameters()}


def main(model_dir: str, out: str, zero_stages: list[int]) -> None:
    import torch.distributed as dist

    from ragen_core.policy import load_policy

    torch.set_num_threads(1)
    model, tokenizer = load_policy(model_dir)
    for stage in zero_stages:
        results = run_cases(model, tokenizer, stage, Path(out) / f"export-zero{stage}")
        if dist.get_rank() == 0:
            torch.save({"world_size": dist.get_world_size(), "results": results}, Path(out) / f"zero{stage}.pt")
        dist.barrier()


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main(sys.argv[1], sys.argv[2], [int(stage) for stage in sys.argv[3].split(",")])
