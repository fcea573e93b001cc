"""The actor: a DeepSpeed engine around the policy, doing StarPO (PPO/GRPO) and supervised updates.

It runs in one CPU process with no launcher (see :mod:`ragen_core.training.distributed`). Gradient accumulation is
caller-owned (``managed_gradient_accumulation: false``): every micro-batch calls ``backward`` and each mini-batch
ends with one ``step``, so mini-batches of any size average exactly over their own tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ragen_core.algos import POLICY_LOSSES, aggregate_loss, kl_penalty
from ragen_core.training.batch import TokenBatch, token_logprobs
from ragen_core.training.distributed import ensure_single_process_env


@dataclass(frozen=True)
class OptimConfig:
    """What the engine needs to know about optimisation."""

    lr: float
    weight_decay: float
    grad_clip: float
    micro_batch_size: int
    zero_stage: int = 0
    optimizer: str = "adamw"


@dataclass(frozen=True)
class PolicyUpdateConfig:
    """Settings of one StarPO policy update (advantages are computed before, see :mod:`ragen_core.training.starpo`)."""

    policy_loss: str
    clip_low: float
    clip_high: float
    kl_coef: float
    entropy_coef: float
    loss_agg_mode: str
    mini_batch_size: int
    ppo_epochs: int
    clip_ratio_c: float | None = None  # the dual-clip bound; None = plain (decoupled) clipping
    kl_estimator: str = "low_var_kl"
    online_k: int | None = None


def update_schedule(
    num_rows: int, mini_batch_size: int, ppo_epochs: int, online_k: int | None, rng: np.random.Generator
) -> list[list[int]]:
    """Row indices of every optimizer step of one update.

    Default (``online_k`` None): ``ppo_epochs`` reshuffled passes, each cut into mini-batches (the last may be
    smaller). Online-k: exactly ``online_k`` steps of ``mini_batch_size`` rows each, drawn from consecutive
    reshuffled passes over the batch (a step may straddle two passes; rows repeat only when the batch is smaller
    than a mini-batch), so the update batch size stays fixed whatever k is.
    """
    if online_k is None:
        steps = []
        for _ in range(ppo_epochs):
            order = rng.permutation(num_rows).tolist()
            steps.extend(order[start : start + mini_batch_size] for start in range(0, num_rows, mini_batch_size))
        return steps
    steps, pool = [], []
    while len(steps) < online_k:
        while len(pool) < mini_batch_size:
            pool.extend(rng.permutation(num_rows).tolist())
        steps.append(pool[:mini_batch_size])
        pool = pool[mini_batch_size:]
    return steps


def deepspeed_config(optim: OptimConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config of the actor engine."""
    return {
        "train_micro_batch_size_per_gpu": optim.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": {"stage": optim.zero_stage},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """The torch optimizer handed to DeepSpeed (no compiled op needed)."""
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    if optim.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    raise ValueError(f"unknown optimizer {optim.optimizer!r}; use 'adamw' or 'sgd'")


def grad_norm(engine: Any) -> float:
    """Global gradient norm before clipping (ZeRO-0 keeps whole gradients on the parameters)."""
    grads = [p.grad.detach() for p in engine.module.parameters() if p.grad is not None]
    if grads:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")


class ActorEngine:
    """Owns the policy's DeepSpeed engine (and, when KL is on, a frozen reference copy)."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, keep_reference: bool = False) -> None:
        ensure_single_process_env()
        import deepspeed

        self.optim = optim
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if keep_reference else None
        optimizer = build_optimizer(model, optim)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config(optim))

    @property
    def module(self) -> torch.nn.Module:
        """The policy model (for generation and export)."""
        return self.engine.module

    def _micro_batches(self, batch: TokenBatch, rows: list[int]) -> list[tuple[list[int], TokenBatch]]:
        size = self.optim.micro_batch_size
        return [(rows[i : i + size], batch.select(rows[i : i + size])) for i in range(0, len(rows), size)]

    @torch.no_grad()
    def score(self, batch: TokenBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Log-probs (B, T) of the batch under the current policy (or ``model``), in eval mode, no gradients."""
        model = model or self.module
        was_training = model.training
        model.eval()
        out = torch.zeros_like(batch.loss_mask)
        for rows, micro in self._micro_batches(batch, list(range(len(batch)))):
            logprobs, _ = token_logprobs(model, micro)
            out[rows, : logprobs.shape[1]] = logprobs
        model.train(was_training)
        return out

    def policy_update(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor,
        config: PolicyUpdateConfig,
        shuffle_seed: int,
        ref_logprobs: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """PPO-style optimizer steps on ``batch`` (the kept trajectories) with precomputed ``advantages`` (B, T).

        ``old_logprobs`` are the actor's own re-scored log-probs (as RAGEN/veRL do; the stored behaviour log-probs
        serve analysis and offline importance weighting). ``ref_logprobs`` adds the KL loss term (``kl_coef``).
        Returns metrics averaged over the optimizer steps, plus ``actor/optimizer_steps``.
        """
        loss_fn = POLICY_LOSSES.get(config.policy_loss)
        rng = np.random.default_rng(shuffle_seed)
        schedule = update_schedule(len(batch), config.mini_batch_size, config.ppo_epochs, config.online_k, rng)
        history: dict[str, list[float]] = {}
        self.engine.train()
        for rows in schedule:
            stats = self._ppo_step(batch, rows, old_logprobs, ref_logprobs, advantages, loss_fn, config)
            for key, value in stats.items():
                history.setdefault(key, []).append(value)
        metrics = {key: float(np.mean(values)) for key, values in history.items()}
        metrics["actor/optimizer_steps"] = float(len(schedule))
        metrics["actor/grad_norm_max"] = float(np.max(history["actor/grad_norm"]))
        return metrics

    def _ppo_step(self, batch, rows, old_logprobs, ref_logprobs, advantages, loss_fn, config) -> dict[str, float]:
        """Forward/backward every micro-batch of one mini-batch, then one optimizer step."""
        token_count = float(batch.loss_mask[rows].sum())
        sums: dict[str, float] = {}
        for micro_rows, micro in self._micro_batches(batch, rows):
            width = micro.input_ids.shape[1]
            weight = len(micro_rows) / len(rows)  # seq-mean: this micro-batch's share of the mini-batch
            logprobs, entropy = token_logprobs(self.engine, micro, with_entropy=True)
            old = old_logprobs[micro_rows, :width]
            adv = advantages[micro_rows, :width]
            count = token_count if config.loss_agg_mode == "token-mean" else None
            pg_loss, pg_stats = loss_fn(
                logprobs,
                old,
                adv,
                micro.loss_mask,
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                loss_agg_mode=config.loss_agg_mode,
                token_count=count,
                clip_ratio_c=config.clip_ratio_c,
            )
            entropy_loss = aggregate_loss(entropy, micro.loss_mask, config.loss_agg_mode, count)
            loss = pg_loss - config.entropy_coef * entropy_loss
            if ref_logprobs is not None:
                kl = aggregate_loss(
                    kl_penalty(logprobs, ref_logprobs[micro_rows, :width], config.kl_estimator),
                    micro.loss_mask,
                    config.loss_agg_mode,
                    count,
                )
                loss = loss + config.kl_coef * kl
                sums["actor/kl_loss"] = sums.get("actor/kl_loss", 0.0) + float(kl.detach()) * _share(config, weight)
            if config.loss_agg_mode != "token-mean":
                loss = loss * weight
            self.engine.backward(loss, scale_wrt_gas=False)
            share = _share(config, weight)
            micro_tokens = float(micro.loss_mask.sum()) / max(token_count, 1.0)
            sums["actor/pg_loss"] = sums.get("actor/pg_loss", 0.0) + float(pg_loss.detach()) * share
            sums["actor/entropy"] = sums.get("actor/entropy", 0.0) + float(entropy_loss.detach()) * share
            for key, value in pg_stats.items():
                sums[f"actor/{key}"] = sums.get(f"actor/{key}", 0.0) + float(value) * micro_tokens
        sums["actor/grad_norm"] = grad_norm(self.engine)
        self.engine.step()
        sums["actor/lr"] = float(self.engine.get_lr()[0])
        return sums

    def sft_update(self, batch: TokenBatch, batch_size: int, shuffle_seed: int) -> dict[str, float]:
        """One epoch of supervised learning: token-mean cross-entropy on the loss-masked tokens."""
        rng = np.random.default_rng(shuffle_seed)
        order = rng.permutation(len(batch)).tolist()
        losses = []
        self.engine.train()
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            token_count = float(batch.loss_mask[rows].sum())
            total = 0.0
            for _, micro in self._micro_batches(batch, rows):
                logprobs, _ = token_logprobs(self.engine, micro)
                loss = -aggregate_loss(logprobs, micro.loss_mask, "token-mean", token_count)
                self.engine.backward(loss, scale_wrt_gas=False)
                total += float(loss.detach())
            self.engine.step()
            losses.append(total)
        return {"sft/loss": float(np.mean(losses)), "sft/steps": float(len(losses))}


def _share(config: PolicyUpdateConfig, weight: float) -> float:
    """Weight of a micro-batch's aggregated value in the mini-batch value (token-mean values already share the
    mini-batch's denominator, so they simply add up)."""
    return 1.0 if config.loss_agg_mode == "token-mean" else weight
