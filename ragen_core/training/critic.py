"""The critic: a value model (the policy's transformer with a scalar head) in a DeepSpeed engine, for GAE.

Set up like :mod:`ragen_core.training.actor`: one CPU/GPU process with no launcher, caller-owned gradient accumulation
(every micro-batch calls ``backward``, each mini-batch ends with one ``step``), so mini-batches of any size average
exactly over their own tokens. Training minimises the clipped value loss of :func:`ragen_core.algos.value_loss`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ragen_core.algos import value_loss
from ragen_core.training.actor import OptimConfig, build_optimizer, deepspeed_config, grad_norm
from ragen_core.training.batch import TokenBatch
from ragen_core.training.distributed import ensure_single_process_env


@dataclass(frozen=True)
class ValueUpdateConfig:
    """Settings of one critic update."""

    cliprange_value: float
    loss_agg_mode: str
    mini_batch_size: int
    ppo_epochs: int


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
        from transformers import AutoModelForCausalLM

        policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
        return cls(policy.base_model, policy.config.hidden_size, head_seed)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
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

    @property
    def module(self) -> ValueModel:
        """The value model."""
        return self.engine.module

    def _micro_batches(self, batch: TokenBatch, rows: list[int]) -> list[tuple[list[int], TokenBatch]]:
        size = self.optim.micro_batch_size
        return [(rows[i : i + size], batch.select(rows[i : i + size])) for i in range(0, len(rows), size)]

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """Values (B, T) of the batch in eval mode, no gradients; 0 outside ``batch.loss_mask``."""
        was_training = self.module.training
        self.module.eval()
        out = torch.zeros_like(batch.loss_mask)
        for rows, micro in self._micro_batches(batch, list(range(len(batch)))):
            values = self.module(input_ids=micro.input_ids, attention_mask=micro.attention_mask)
            out[rows, : values.shape[1]] = values.to(out.dtype)
        self.module.train(was_training)
        return out * batch.loss_mask

    def update(
        self,
        batch: TokenBatch,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        config: ValueUpdateConfig,
        shuffle_seed: int,
    ) -> dict[str, float]:
        """``ppo_epochs`` passes of shuffled mini-batches, each one optimizer step on the clipped value loss towards
        ``returns`` over the tokens of ``mask`` (B, T). Returns metrics averaged over the mini-batches."""
        rng = np.random.default_rng(shuffle_seed)
        history: dict[str, list[float]] = {}
        self.engine.train()
        for _ in range(config.ppo_epochs):
            order = rng.permutation(len(batch)).tolist()
            for start in range(0, len(order), config.mini_batch_size):
                rows = order[start : start + config.mini_batch_size]
                for key, value in self._value_step(batch, rows, old_values, returns, mask, config).items():
                    history.setdefault(key, []).append(value)
        return {key: float(np.mean(values)) for key, values in history.items()}

    def _value_step(self, batch, rows, old_values, returns, mask, config: ValueUpdateConfig) -> dict[str, float]:
        """Forward/backward every micro-batch of one mini-batch, then one optimizer step."""
        token_mean = config.loss_agg_mode == "token-mean"
        token_count = float(mask[rows].sum())
        sums = {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}
        for micro_rows, micro in self._micro_batches(batch, rows):
            width = micro.input_ids.shape[1]
            micro_mask = mask[micro_rows, :width]
            vpreds = self.engine(input_ids=micro.input_ids, attention_mask=micro.attention_mask)  # (b, width)
            loss, stats = value_loss(
                vpreds,
                old_values[micro_rows, :width],
                returns[micro_rows, :width],
                micro_mask,
                config.cliprange_value,
                config.loss_agg_mode,
                token_count if token_mean else None,
            )
            # token-mean losses share the mini-batch denominator and add up; seq-mean ones are weighted by rows
            share = 1.0 if token_mean else len(micro_rows) / len(rows)
            self.engine.backward(loss * share, scale_wrt_gas=False)
            token_share = float(micro_mask.sum()) / max(token_count, 1.0)
            sums["critic/vf_loss"] += float(loss.detach()) * share
            sums["critic/vf_clipfrac"] += float(stats["vf_clipfrac"]) * token_share
            sums["critic/vpred_mean"] += float(stats["vpred_mean"]) * token_share
        sums["critic/grad_norm"] = grad_norm(self.engine)
        self.engine.step()
        sums["critic/lr"] = float(self.engine.get_lr()[0])
        return sums
