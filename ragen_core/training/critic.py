"""The critic: a value model (the policy's transformer with a scalar head) in a DeepSpeed engine, for GAE.

Set up like :mod:`ragen_core.training.actor`: one CPU/GPU process with no launcher, caller-owned gradient accumulation
(every micro-batch calls ``backward``, each mini-batch ends with one ``step``), so mini-batches of any size average
exactly over their own tokens. Training minimises the clipped value loss of :func:`ragen_core.algos.value_loss`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ragen_core.algos import value_loss
from ragen_core.algos.losses import trained_sequences
from ragen_core.training.actor import (
    OptimConfig,
    build_optimizer,
    check_data_parallel,
    deepspeed_config,
    micro_batch_passes,
    optimizer_step,
)
from ragen_core.training.batch import per_token_outputs
from ragen_core.training.distributed import ensure_single_process_env
from ragen_core.training.parallel import MicroBatchPlan, all_reduce_sum, all_reduce_sums, data_parallel_world
from ragen_core.update.rows import TokenBatch

if TYPE_CHECKING:
    from ragen_core.config import AlgorithmConfig, CriticConfig


class ValueModel(torch.nn.Module):
    """A causal-LM backbone (no LM head) with a scalar linear head on its last hidden states.

    ``values[b, t]`` is the value of the state *before* token t, read from the hidden state at t - 1, matching
    :func:`ragen_core.training.batch.token_logprobs` (position t scores token t given the tokens before it); column 0
    is 0. This is veRL's alignment of critic values with response tokens.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int, head_seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        generator = torch.Generator().manual_seed(head_seed)
        with torch.no_grad():  # small random head, zero bias: values start near 0 (HF's classification-head init)
            self.value_head.weight.copy_(torch.randn(self.value_head.weight.shape, generator=generator) * 0.02)
            self.value_head.bias.zero_()
        dtype = next(backbone.parameters()).dtype
        self.value_head.to(dtype)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module, head_seed: int = 0) -> ValueModel:
        """A value model on a copy of ``policy``'s transformer (``base_model``, the causal LM without its head)."""
        return cls(copy.deepcopy(policy.base_model), policy.config.hidden_size, head_seed)

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, dtype: torch.dtype = torch.float32, head_seed: int = 0
    ) -> ValueModel:
        """Load the transformer of a local Hugging Face causal-LM directory (nothing is downloaded)."""
        from ragen_core.policy.loading import load_causal_lm

        policy = load_causal_lm(model_dir, dtype)
        return cls(policy.base_model, policy.config.hidden_size, head_seed)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **inputs: torch.Tensor | bool
    ) -> torch.Tensor:
        """Values (B, T) of ``input_ids``; further keyword inputs as :func:`model_inputs` gives them (packed rows
        pass ``position_ids`` and no mask)."""
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        hidden = self.backbone(input_ids=input_ids, **inputs).last_hidden_state  # (B, T, H)
        scores = self.value_head(hidden).squeeze(-1).float()  # (B, T): value after reading token t
        return torch.cat([torch.zeros_like(scores[:, :1]), scores[:, :-1]], dim=1)  # (B, T): value before token t


class CriticEngine:
    """Owns the value model's DeepSpeed engine: values for GAE, clipped value-loss updates."""

    def __init__(self, model: ValueModel, optim: OptimConfig) -> None:
        ensure_single_process_env()
        import deepspeed

        self.optim = optim
        config = deepspeed_config(optim)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=build_optimizer(model, optim), config=config
        )
        check_data_parallel(optim)
        self.device = torch.device(self.engine.device)

    @property
    def module(self) -> ValueModel:
        """The value model."""
        return self.engine.module

    def _passes(self, rows: list[int], batch: TokenBatch, lockstep: bool = True) -> list[MicroBatchPlan]:
        """This rank's micro-batch passes (see :meth:`ragen_core.training.actor.ActorEngine._passes`)."""
        return micro_batch_passes(rows, batch, self.optim, lockstep)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """Values (B, T) of the batch in eval mode, no gradients; 0 outside ``batch.loss_mask``. Data-parallel:
        each rank computes its micro-batches' rows and the results are summed over ranks."""
        was_training = self.module.training
        self.module.eval()
        out = torch.zeros_like(batch.loss_mask)
        for plan in self._passes(list(range(len(batch))), batch, self.engine.zero_optimization_partition_weights()):
            micro = batch.select(plan.rows).to(self.device)
            values = per_token_outputs(self.module, micro)
            if plan.weight > 0:
                out[plan.rows, : values.shape[1]] = values.to(device=out.device, dtype=out.dtype)
        self.module.train(was_training)
        return all_reduce_sum(out, self.device) * batch.loss_mask

    def update(
        self,
        batch: TokenBatch,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        algorithm: AlgorithmConfig,
        schedule: CriticConfig,
        shuffle_seed: int,
    ) -> dict[str, float]:
        """``schedule.ppo_epochs`` passes of shuffled mini-batches of ``schedule.mini_batch_size`` rows (the critic
        section with its sizes set), each one optimizer step on the value loss clipped at ``schedule.cliprange_value``
        and aggregated as ``algorithm.loss_agg_mode``, towards ``returns`` over the tokens of ``mask`` (B, T).
        Returns metrics averaged over the mini-batches."""
        if schedule.mini_batch_size is None or schedule.ppo_epochs is None:
            raise ValueError("the critic's update needs its mini_batch_size and ppo_epochs set (or the actor's)")
        rng = np.random.default_rng(shuffle_seed)
        history: dict[str, list[float]] = {}
        self.engine.train()
        losses = (schedule.cliprange_value, algorithm.loss_agg_mode)
        for _ in range(schedule.ppo_epochs):
            order = rng.permutation(len(batch)).tolist()
            for start in range(0, len(order), schedule.mini_batch_size):
                rows = order[start : start + schedule.mini_batch_size]
                for key, value in self._value_step(batch, rows, old_values, returns, mask, *losses).items():
                    history.setdefault(key, []).append(value)
        return {key: float(np.mean(values)) for key, values in history.items()}

    def _value_step(
        self, batch, rows, old_values, returns, mask, cliprange_value: float, loss_agg_mode: str
    ) -> dict[str, float]:
        """Forward/backward this rank's micro-batches of one mini-batch, then one optimizer step (metrics summed over
        ranks)."""
        token_mean = loss_agg_mode == "token-mean"
        token_count = float(mask[rows].sum())
        _, world = data_parallel_world()
        sums = {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}
        for plan in self._passes(rows, batch):
            micro = batch.select(plan.rows).to(self.device)
            width = micro.input_ids.shape[1]
            micro_mask = mask[plan.rows, :width].to(self.device)
            vpreds = per_token_outputs(self.engine, micro)  # (b, width)
            loss, stats = value_loss(
                vpreds,
                old_values[plan.rows, :width].to(self.device),
                returns[plan.rows, :width].to(self.device),
                micro_mask,
                cliprange_value,
                loss_agg_mode,
                token_count if token_mean else None,
            )
            # token-mean losses share the mini-batch denominator and add up; seq-mean ones are weighted by rows
            share = 1.0 if token_mean else trained_sequences(mask[plan.rows]) / max(trained_sequences(mask[rows]), 1)
            scaled = loss * share
            if world > 1 or plan.weight != 1.0:  # DeepSpeed averages over ranks: scale so that the ranks' sum counts
                scaled = scaled * (plan.weight * world)
            self.engine.backward(scaled, scale_wrt_gas=False)
            token_share = float(micro_mask.sum()) / max(token_count, 1.0)
            sums["critic/vf_loss"] += float(loss.detach()) * share * plan.weight
            sums["critic/vf_clipfrac"] += float(stats["vf_clipfrac"]) * token_share * plan.weight
            sums["critic/vpred_mean"] += float(stats["vpred_mean"]) * token_share * plan.weight
        sums = all_reduce_sums(sums, self.device)
        sums["critic/grad_norm"] = optimizer_step(self.engine)
        sums["critic/lr"] = float(self.engine.get_lr()[0])
        return sums
