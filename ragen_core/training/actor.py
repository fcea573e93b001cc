"""The actor: a DeepSpeed engine around the policy, doing StarPO (PPO/GRPO) and supervised updates.

By default it runs in one process with no launcher (see :mod:`ragen_core.training.distributed`); in a group started
by ``torchrun`` or the ``deepspeed`` launcher the same code runs data-parallel (see
:mod:`ragen_core.training.parallel`): each rank runs its share of every mini-batch's micro-batches with the
mini-batch's own loss normalisers. Gradient accumulation is caller-owned (``managed_gradient_accumulation: false``):
every micro-batch calls ``backward`` and each mini-batch ends with one ``step``, so mini-batches of any size average
exactly over their own tokens.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ragen_core.algos import POLICY_LOSSES, aggregate_loss, kl_penalty
from ragen_core.algos.losses import trained_sequences
from ragen_core.policy.lora import forward_of, start_adapters, weights_digest, wrap_lora
from ragen_core.training.batch import token_logprobs, trained_columns
from ragen_core.training.cost import ModelShape, PassTally
from ragen_core.training.distributed import ensure_single_process_env
from ragen_core.training.parallel import (
    MicroBatchPlan,
    all_reduce_max,
    all_reduce_sum,
    all_reduce_sums,
    data_parallel_world,
    shard_micro_batches,
)
from ragen_core.training.precision import precision_config, torch_dtype
from ragen_core.update.rows import TokenBatch

if TYPE_CHECKING:
    from pathlib import Path

    from ragen_core.config import ActorConfig, AlgorithmConfig, LoraConfig


@dataclass(frozen=True)
class OptimConfig:
    """What the engine needs to know about optimisation."""

    lr: float
    weight_decay: float
    grad_clip: float
    micro_batch_size: int
    zero_stage: int = 0
    optimizer: str = "adamw"
    precision: str = "fp32"  # a resolved precision: fp32, bf16 or fp16 (see ragen_core.training.precision)
    micro_batch_tokens: int | None = None  # token budget per micro-batch (rows bucketed by length); None: row count
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (memory for compute)
    attn_implementation: str | None = None  # transformers' attention kernel (sdpa, flash_attention_2, eager)


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
    """The DeepSpeed JSON config of the actor (and critic) engine: ZeRO stage, precision, clipping, caller-owned
    gradient accumulation."""
    return {
        "train_micro_batch_size_per_gpu": optim.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": {"stage": optim.zero_stage},
        # torch's AdamW / SGD are not on DeepSpeed's list of ZeRO-tested optimizers, but ZeRO only partitions their
        # state; the distributed tests check the update against the one-process one
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        **precision_config(optim.precision, optim.zero_stage),
    }


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """The torch optimizer handed to DeepSpeed (no compiled op needed), over the trainable parameters only (under
    LoRA the adapters; otherwise every parameter, in the module's order)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(trained, lr=optim.lr, weight_decay=optim.weight_decay)
    if optim.optimizer == "sgd":
        return torch.optim.SGD(trained, lr=optim.lr, weight_decay=optim.weight_decay)
    raise ValueError(f"unknown optimizer {optim.optimizer!r}; use 'adamw' or 'sgd'")


def optimizer_step(engine: Any) -> float:
    """``engine.step()``; returns the global gradient norm before clipping.

    fp32 ZeRO-0 (one process) keeps whole, unscaled gradients on the parameters, so the norm is read from them
    before the step (DeepSpeed does not report it for a plain torch optimizer). With ZeRO >= 1 (gradients reduced
    and partitioned inside the step) or bf16/fp16 (gradients in low precision, fp16 ones loss-scaled) DeepSpeed
    computes the unscaled global norm itself during the step, and that one is returned.
    """
    reports_norm = engine.zero_optimization() or engine.bfloat16_enabled() or engine.fp16_enabled()
    own = None
    if not reports_norm:
        grads = [p.grad.detach() for p in engine.module.parameters() if p.grad is not None]
        if grads:
            own = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    engine.step()
    if own is not None:
        return own
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")


def micro_batch_passes(rows: list[int], batch: TokenBatch, optim: OptimConfig, lockstep: bool) -> list[MicroBatchPlan]:
    """This rank's micro-batch passes over ``rows`` of ``batch`` (:func:`shard_micro_batches`): at most
    ``micro_batch_size`` rows each and, with a token budget ``micro_batch_tokens``, rows of like length together
    under it. Without ``lockstep`` the zero-weight padding passes are left out."""
    rank, world = data_parallel_world()
    lengths = batch.attention_mask[rows].sum(dim=1).tolist() if optim.micro_batch_tokens else None
    passes = shard_micro_batches(rows, optim.micro_batch_size, rank, world, lengths, optim.micro_batch_tokens)
    return passes if lockstep else [p for p in passes if p.weight > 0]


def prepare_model(model: torch.nn.Module, optim: OptimConfig) -> None:
    """Before the engine wraps ``model``: the attention kernel transformers should use, and gradient checkpointing
    (non-reentrant, so it works with frozen inputs and DeepSpeed's hooks)."""
    if optim.attn_implementation and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(optim.attn_implementation)
    if optim.gradient_checkpointing:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise ValueError(
                f"{type(model).__name__} has no gradient checkpointing; set actor.gradient_checkpointing to false"
            )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def check_data_parallel(optim: OptimConfig) -> None:
    """Refuse ZeRO-0 in a group of several processes: its gradient norm (a logged metric and the Echo-Trap
    monitor's input) would only be the local one."""
    _, world = data_parallel_world()
    if world > 1 and optim.zero_stage == 0:
        raise ValueError(
            f"a data-parallel update over {world} processes needs ZeRO stage 1, 2 or 3; set actor.zero_stage"
        )


class ActorEngine:
    """Owns the policy's DeepSpeed engine (and, when KL is on, a frozen reference copy)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optim: OptimConfig,
        keep_reference: bool = False,
        lora: LoraConfig | None = None,
        lora_seed: int = 0,
        start_adapter: Path | None = None,
    ) -> None:
        """With ``lora``, ``model`` becomes the frozen base of fresh adapters (:func:`wrap_lora`, seeded by
        ``lora_seed``; ``start_adapter``: their start weights from that adapter folder instead) and only they are
        trained; ``keep_reference`` then keeps no copy: the KL reference is the policy with its adapters off
        (:meth:`reference_logprobs`)."""
        ensure_single_process_env()
        import deepspeed

        self.optim = optim
        self.tally = PassTally(ModelShape.of(model))  # the FLOPs of its passes, for the update's perf/* metrics
        prepare_model(model, optim)
        self.adapter = lora is not None
        self.base_digest = weights_digest(model) if lora is not None else None  # what a checkpoint's base must be
        if lora is not None:
            model = wrap_lora(model, lora, lora_seed)  # before DeepSpeed: its parameters are the adapters' too
            if start_adapter is not None:
                start_adapters(model, start_adapter)
        keep = keep_reference and lora is None
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if keep else None
        optimizer = build_optimizer(model, optim)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config(optim))
        check_data_parallel(optim)
        self.device = torch.device(self.engine.device)
        # Hugging Face causal LMs that take logits_to_keep project only the positions the update trains on
        self.keeps_logits = "logits_to_keep" in inspect.signature(forward_of(model)).parameters
        if self.reference is not None:  # where and in what precision the policy runs
            self.reference.to(device=self.device, dtype=torch_dtype(optim.precision))

    @property
    def module(self) -> torch.nn.Module:
        """The policy model (for generation and export)."""
        return self.engine.module

    def _passes(self, rows: list[int], batch: TokenBatch, lockstep: bool = True) -> list[MicroBatchPlan]:
        """This rank's micro-batch passes over ``rows`` of ``batch`` (under ``micro_batch_tokens``, bucketed by the
        rows' lengths); without ``lockstep`` the zero-weight padding passes are left out (forward-only work needs
        them only when ZeRO-3 gathers weights inside the forward)."""
        return micro_batch_passes(rows, batch, self.optim, lockstep)

    @torch.no_grad()
    def score(self, batch: TokenBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Log-probs (B, T) of the batch under the current policy (or ``model``), in eval mode, no gradients.

        Data-parallel: each rank scores its micro-batches and the (B, T) results are summed over ranks (each row is
        filled by exactly one rank, the others add zeros).
        """
        model = model or self.module
        was_training = model.training
        model.eval()
        out = torch.zeros_like(batch.loss_mask)
        lockstep = model is self.module and self.engine.zero_optimization_partition_weights()
        for plan in self._passes(list(range(len(batch))), batch, lockstep):
            host = batch.select(plan.rows)
            logprobs, _ = token_logprobs(model, host.to(self.device))
            if plan.weight > 0:
                self.tally.add(host)
                out[plan.rows, : logprobs.shape[1]] = logprobs.to(out.device)
        model.train(was_training)
        return all_reduce_sum(out, self.device)

    def reference_logprobs(self, batch: TokenBatch) -> torch.Tensor | None:
        """Log-probs (B, T) of the batch under the KL reference: the frozen copy of the start policy, or under LoRA
        the policy with its adapters off (the frozen start model itself); None when the engine keeps neither."""
        if self.reference is not None:
            return self.score(batch, self.reference)
        if self.adapter:
            with self.module.disable_adapter():
                return self.score(batch)
        return None

    def policy_update(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor,
        algorithm: AlgorithmConfig,
        schedule: ActorConfig,
        shuffle_seed: int,
        ref_logprobs: torch.Tensor | None = None,
        watch_old_gap: bool = False,
        kl_mask: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """PPO-style optimizer steps on ``batch`` (the kept trajectories) with precomputed ``advantages`` (B, T).

        ``old_logprobs`` are the policy's log-probs of the batch before the update: the re-scored batch, or the
        sampler's stored ones when they are the same (see :func:`ragen_core.training.starpo.reuses_behavior_logprobs`).
        ``algorithm`` says the loss (``policy_loss``, which reads the options it declares from it), the entropy and KL
        terms and the aggregation; ``schedule`` (the actor section) the optimizer steps: ``mini_batch_size``,
        ``ppo_epochs``, ``online_k``. ``ref_logprobs`` adds the KL loss term (``kl_coef``), over the trained tokens
        that ``kl_mask`` (B, T) keeps (all of them when None). With ``watch_old_gap``
        the first optimizer step, whose forward runs on the weights before any change, also records
        ``actor/behavior_logprob_gap``: the largest |current - old| log-prob over that mini-batch's trained tokens
        (0 up to float summation order when the old log-probs are the policy's; no extra compute). Returns metrics
        averaged over the optimizer steps, plus ``actor/optimizer_steps``.
        """
        loss_fn = POLICY_LOSSES.bind(algorithm.policy_loss, algorithm)
        rng = np.random.default_rng(shuffle_seed)
        steps = update_schedule(len(batch), schedule.mini_batch_size, schedule.ppo_epochs, schedule.online_k, rng)
        step_inputs = _StepInputs(batch, old_logprobs, ref_logprobs, advantages, loss_fn, algorithm, kl_mask)
        history: dict[str, list[float]] = {}
        gap = None
        self.engine.train()
        for index, rows in enumerate(steps):
            stats = self._ppo_step(step_inputs, rows, watch_gap=watch_old_gap and index == 0)
            gap = stats.pop(GAP_METRIC, gap)
            for key, value in stats.items():
                history.setdefault(key, []).append(value)
        metrics = {key: float(np.mean(values)) for key, values in history.items()}
        metrics["actor/optimizer_steps"] = float(len(steps))
        metrics["actor/grad_norm_max"] = float(np.max(history["actor/grad_norm"]))
        if gap is not None:
            metrics[GAP_METRIC] = gap
        return metrics

    def _ppo_step(self, inputs: _StepInputs, rows: list[int], watch_gap: bool = False) -> dict[str, float]:
        """Forward/backward this rank's micro-batches of one mini-batch, then one optimizer step. Returns the
        mini-batch's metrics (summed over ranks).

        The metrics stay on the device as tensors through the micro-batches (no host round-trip there) and come to
        the host once, with the optimizer step."""
        mask = inputs.batch.loss_mask  # on the host: the normalisers below cost the device nothing
        token_count = float(mask[rows].sum())
        sequences = max(trained_sequences(mask[rows]), 1)
        _, world = data_parallel_world()
        sums: dict[str, torch.Tensor] = {}
        gap = torch.zeros((), device=self.device) if watch_gap else None
        for plan in self._passes(rows, inputs.batch):
            # seq-mean: this micro-batch's share of the mini-batch's trained sequences (rows without tokens count 0)
            weight = trained_sequences(mask[plan.rows]) / sequences
            micro_tokens = float(mask[plan.rows].sum()) / max(token_count, 1.0)
            loss, values, micro_gap = self._ppo_micro(inputs, plan, token_count, weight, micro_tokens, watch_gap)
            if world > 1 or plan.weight != 1.0:  # DeepSpeed averages over ranks: scale so that the ranks' sum counts
                loss = loss * (plan.weight * world)
            self.engine.backward(loss, scale_wrt_gas=False)
            for key, value in values.items():
                term = value.double() * plan.weight
                sums[key] = sums[key] + term if key in sums else term
            if gap is not None and micro_gap is not None and plan.weight > 0:
                gap = torch.maximum(gap, micro_gap)
        stats = _to_host(sums, self.device)
        if gap is not None:
            stats[GAP_METRIC] = float(all_reduce_max(gap, self.device))
        steps_skipped = self.engine.skipped_steps
        stats["actor/grad_norm"] = optimizer_step(self.engine)
        stats["actor/lr"] = float(self.engine.get_lr()[0])
        if self.optim.precision == "fp16":  # a loss-scale overflow skips the step
            stats["actor/skipped_steps"] = float(self.engine.skipped_steps - steps_skipped)
        return stats

    def _ppo_micro(
        self,
        inputs: _StepInputs,
        plan: MicroBatchPlan,
        token_count: float,
        weight: float,
        micro_tokens: float,
        watch_gap: bool,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
        """The loss of one micro-batch (normalised by the whole mini-batch), its share of the metrics (detached
        device tensors) and, with ``watch_gap``, the largest |current - old| log-prob over its trained tokens."""
        algorithm, rows = inputs.algorithm, plan.rows
        host = inputs.batch.select(rows)
        micro = host.to(self.device, non_blocking=True)
        width = micro.input_ids.shape[1]
        # only the columns with trained tokens get logits (found on the host: no device round-trip); the entropy is
        # a metric only when its coefficient is 0: then no graph is kept for it
        columns = trained_columns(host.loss_mask) if self.keeps_logits else None
        columns = columns if columns is not None and len(columns) else None
        if plan.weight > 0:  # a zero-weight pass (ZeRO-3's lockstep padding) is waste, not work
            self.tally.add(host, columns, backward=True)
        columns = columns.to(self.device, non_blocking=True) if columns is not None else None
        logprobs, entropy = token_logprobs(
            self.engine, micro, with_entropy=True, entropy_grad=algorithm.entropy_coef != 0, columns=columns
        )
        old = inputs.old_logprobs[rows, :width].to(self.device, non_blocking=True)
        adv = inputs.advantages[rows, :width].to(self.device, non_blocking=True)
        mode = algorithm.loss_agg_mode
        count = token_count if mode == "token-mean" else None
        pg_loss, pg_stats = inputs.loss_fn(logprobs, old, adv, micro.loss_mask, token_count=count)
        entropy_loss = aggregate_loss(entropy, micro.loss_mask, mode, count)
        loss = pg_loss - algorithm.entropy_coef * entropy_loss if algorithm.entropy_coef else pg_loss
        share = 1.0 if mode == "token-mean" else weight  # token-mean values share the mini-batch's denominator
        values: dict[str, torch.Tensor] = {}
        if inputs.ref_logprobs is not None:
            reference = inputs.ref_logprobs[rows, :width].to(self.device, non_blocking=True)
            kl_tokens = micro.loss_mask
            if inputs.kl_mask is not None:
                kl_tokens = kl_tokens * inputs.kl_mask[rows, :width].to(self.device, non_blocking=True)
            kl = aggregate_loss(kl_penalty(logprobs, reference, algorithm.kl_estimator), kl_tokens, mode, count)
            loss = loss + algorithm.kl_coef * kl
            values["actor/kl_loss"] = kl.detach() * share
        if mode != "token-mean":
            loss = loss * weight
        values["actor/pg_loss"] = pg_loss.detach() * share
        values["actor/entropy"] = entropy_loss.detach() * share
        for key, value in pg_stats.items():
            values[f"actor/{key}"] = value.detach() * micro_tokens
        gap = None
        if watch_gap:
            gap = ((logprobs.detach() - old).abs() * (micro.loss_mask > 0)).max()
        return loss, values, gap

    def sft_update(self, batch: TokenBatch, batch_size: int, shuffle_seed: int) -> dict[str, float]:
        """One epoch of supervised learning: token-mean cross-entropy on the loss-masked tokens."""
        rng = np.random.default_rng(shuffle_seed)
        order = rng.permutation(len(batch)).tolist()
        _, world = data_parallel_world()
        losses = []
        self.engine.train()
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            token_count = float(batch.loss_mask[rows].sum())
            total = 0.0
            for plan in self._passes(rows, batch):
                host = batch.select(plan.rows)
                micro = host.to(self.device)
                # only the columns with trained tokens get logits (the replies: a fifth of a windowed demonstration)
                columns = trained_columns(host.loss_mask) if self.keeps_logits else None
                columns = columns if columns is not None and len(columns) else None
                if plan.weight > 0:
                    self.tally.add(host, columns, backward=True)
                columns = columns.to(self.device) if columns is not None else None
                logprobs, _ = token_logprobs(self.engine, micro, columns=columns)
                loss = -aggregate_loss(logprobs, micro.loss_mask, "token-mean", token_count)
                scaled = loss * (plan.weight * world) if world > 1 or plan.weight != 1.0 else loss
                self.engine.backward(scaled, scale_wrt_gas=False)
                total += float(loss.detach()) * plan.weight
            total = all_reduce_sums({"loss": total}, self.device)["loss"]
            optimizer_step(self.engine)
            losses.append(total)
        return {"sft/loss": float(np.mean(losses)), "sft/steps": float(len(losses))}


GAP_METRIC = "actor/behavior_logprob_gap"


@dataclass(frozen=True)
class _StepInputs:
    """What every optimizer step of one policy update reads (host tensors, (B, T))."""

    batch: TokenBatch
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]  # the policy loss, its options bound
    algorithm: AlgorithmConfig
    kl_mask: torch.Tensor | None = None  # the tokens the KL term covers (None: every trained token)


def _to_host(sums: dict[str, torch.Tensor], device: torch.device) -> dict[str, float]:
    """Device metric tensors, summed over ranks, as host floats: one transfer (and one collective) per step."""
    if not sums:
        return {}
    keys = sorted(sums)
    stacked = all_reduce_sum(torch.stack([sums[key] for key in keys]), device)
    return dict(zip(keys, stacked.tolist(), strict=True))
