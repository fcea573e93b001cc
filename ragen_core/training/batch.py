"""Padding token-exact trajectories into training tensors, and per-token log-probs from a causal LM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragen_core.algos import entropy_from_logits


@dataclass
class TokenBatch:
    """Right-padded trajectories. ``loss_mask[b, t]`` marks tokens the policy produced (trained on);
    position t's log-prob is that of ``input_ids[b, t]`` given the tokens before it (column 0 is always 0).

    ``position_ids`` is set when some row packs several independent sequences (the windowed context modes): the
    positions restart at 0 at each sequence, and the model then attends only within a sequence (see
    :func:`model_inputs`)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float
    position_ids: torch.Tensor | None = None  # (B, T) long, packed rows only

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on ``device`` (itself when it is already there)."""
        positions = self.position_ids.to(device) if self.position_ids is not None else None
        return TokenBatch(
            self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device), positions
        )

    def select(self, rows: torch.Tensor | list[int]) -> TokenBatch:
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(dim=1).max())
        positions = self.position_ids[rows, :width] if self.position_ids is not None else None
        return TokenBatch(
            self.input_ids[rows, :width], self.attention_mask[rows, :width], self.loss_mask[rows, :width], positions
        )


def packed_positions(segment_lengths: Sequence[int], width: int) -> torch.Tensor:
    """(width,) positions restarting at 0 at each segment; the padding after the last segment continues its count."""
    positions = torch.cat([torch.arange(n) for n in segment_lengths]) if segment_lengths else torch.zeros(0)
    tail = torch.arange(width - len(positions)) + (int(positions[-1]) + 1 if len(positions) else 0)
    return torch.cat([positions, tail]).long()


def collate(
    input_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    pad_id: int,
    segment_lengths: Sequence[Sequence[int] | None] | None = None,
) -> TokenBatch:
    """Right-pad ``input_ids`` and ``loss_masks`` into a :class:`TokenBatch`; rows with ``segment_lengths`` (the
    stored column of windowed rows; None: one sequence) get packed position ids."""
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
    segments = list(segment_lengths) if segment_lengths is not None else []
    if segments and len(segments) != len(input_ids):
        raise ValueError(f"{len(input_ids)} sequences but {len(segments)} segment-length entries")
    if all(lengths is None for lengths in segments):
        return TokenBatch(ids, attention, mask)
    return TokenBatch(ids, attention, mask, _packed_rows(input_ids, segments, mask))


def _packed_rows(
    input_ids: Sequence[Sequence[int]], segments: list[Sequence[int] | None], mask: torch.Tensor
) -> torch.Tensor:
    """(B, T) position ids of a batch with packed rows (a row without segments is one sequence); clears the loss
    mask at each sequence's first token, which has no context within its sequence."""
    rows = []
    for row, (seq, lengths) in enumerate(zip(input_ids, segments, strict=True)):
        lengths = [len(seq)] if lengths is None else list(lengths)
        if sum(lengths) != len(seq) or min(lengths, default=1) < 1:
            raise ValueError(f"row {row}: segment lengths {lengths} do not split its {len(seq)} tokens")
        rows.append(packed_positions(lengths, mask.shape[1]))
        mask[row, torch.tensor(lengths).cumsum(0)[:-1]] = 0.0
    return torch.stack(rows)


def model_inputs(batch: TokenBatch) -> dict[str, torch.Tensor | bool]:
    """Keyword arguments of a causal-LM forward over ``batch``. Packed rows pass position ids that restart per
    sequence and no attention mask: transformers then builds a block-diagonal causal mask (its packed-sequence
    path, which needs ``use_cache=False``); right padding needs no mask under causal attention."""
    if batch.position_ids is None:
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    return {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) of ``batch.input_ids`` under ``model`` (temperature 1), and optionally entropies."""
    logits = model(**model_inputs(batch)).logits  # (B, T, V)
    shifted = logits[:, :-1].float()
    logp = torch.log_softmax(shifted, dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    zeros = torch.zeros_like(logp[:, :1])
    logprobs = torch.cat([zeros, logp], dim=1)
    entropy = torch.cat([zeros, entropy_from_logits(shifted)], dim=1) if with_entropy else None
    return logprobs, entropy
