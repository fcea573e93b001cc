"""The full-distribution token entropy of stored trajectories under a policy (RAGEN-2's entropy filter input).

RAGEN-2's entropy filters rank groups by the entropy of the policy's whole next-token distribution at every trained
token (veRL's ``entropy_from_logits``), averaged over a trajectory's trained tokens. The sampled tokens' negative
log-prob (what the lake stores for free) is a one-sample estimate of the same quantity; this computes it exactly,
with one forward pass over the batch and no gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from ragen_core.training.batch import collate, token_logprobs


class _Tempered(torch.nn.Module):
    """A causal LM whose logits are divided by ``temperature`` (the distribution the sampler drew from)."""

    def __init__(self, model: torch.nn.Module, temperature: float) -> None:
        super().__init__()
        self.model, self.temperature = model, temperature

    def forward(self, **inputs: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.model(**inputs).logits / self.temperature)


@torch.no_grad()
def trajectory_entropy(
    model: torch.nn.Module,
    input_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    batch_size: int = 16,
    segment_lengths: Sequence[Sequence[int] | None] | None = None,
) -> torch.Tensor:
    """(B,) float64: each trajectory's mean over its trained tokens (``loss_mask`` 1) of the entropy of ``model``'s
    full next-token distribution at ``temperature``, ``sum(H_t * mask_t) / max(sum(mask_t), 1)`` as RAGEN-2's
    entropy filter computes it. Packed rows (``segment_lengths``) are scored as their separate sequences."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    was_training = model.training
    model.eval()
    tempered = _Tempered(model, temperature)
    device = next(model.parameters()).device
    out = torch.zeros(len(input_ids), dtype=torch.float64)
    segments = list(segment_lengths) if segment_lengths is not None else [None] * len(input_ids)
    try:
        for start in range(0, len(input_ids), batch_size):
            rows = slice(start, start + batch_size)
            batch = collate(input_ids[rows], loss_masks[rows], pad_id, segments[rows]).to(device)
            _, entropy = token_logprobs(tempered, batch, with_entropy=True, entropy_grad=False)
            mask = batch.loss_mask.double()
            sums = (entropy.double() * mask).sum(dim=1)
            out[rows] = (sums / mask.sum(dim=1).clamp(min=1.0)).cpu()
    finally:
        model.train(was_training)
    return out
