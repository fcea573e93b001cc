"""Padding token-exact trajectories into training tensors, and per-token log-probs from a causal LM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragen_core.algos import entropy_from_logits


@dataclass
class TokenBatch:
    """Right-padded trajectories. ``loss_mask[b, t]`` marks tokens the policy produced (trained on);
    position t's log-prob is that of ``input_ids[b, t]`` given the tokens before it (column 0 is always 0)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on ``device`` (itself when it is already there)."""
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device))

    def select(self, rows: torch.Tensor | list[int]) -> TokenBatch:
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(dim=1).max())
        return TokenBatch(
            self.input_ids[rows, :width], self.attention_mask[rows, :width], self.loss_mask[rows, :width]
        )


def collate(input_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]], pad_id: int) -> TokenBatch:
    """Right-pad ``input_ids`` and ``loss_masks`` into a :class:`TokenBatch`."""
    if len(input_ids) != len(loss_masks):
        raise ValueError(f"{len(input_ids)} sequences but {len(loss_masks)} loss masks")
    width = max(len(ids) for ids in input_ids)
    ids = torch.full((len(input_ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(input_ids), width), dtype=torch.long)
    mask = torch.zeros((len(input_ids), width), dtype=torch.float32)
    for row, (seq, seq_mask) in enumerate(zip(input_ids, loss_masks, strict=True)):
        if len(seq) != len(seq_mask):
            raise ValueError(f"row {row}: {len(seq)} token ids but {len(seq_mask)} loss-mask entries")
        ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        attention[row, : len(seq)] = 1
        mask[row, : len(seq)] = torch.as_tensor(list(seq_mask), dtype=torch.float32)
    mask[:, 0] = 0.0  # the first token has no context to be predicted from
    return TokenBatch(ids, attention, mask)


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) of ``batch.input_ids`` under ``model`` (temperature 1), and optionally entropies."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, T, V)
    shifted = logits[:, :-1].float()
    logp = torch.log_softmax(shifted, dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    zeros = torch.zeros_like(logp[:, :1])
    logprobs = torch.cat([zeros, logp], dim=1)
    entropy = torch.cat([zeros, entropy_from_logits(shifted)], dim=1) if with_entropy else None
    return logprobs, entropy
