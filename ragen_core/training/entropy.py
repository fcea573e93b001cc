"""The full-distribution token entropy of stored trajectories under a policy (RAGEN-2's entropy filter input).

RAGEN-2's entropy filters rank groups by the entropy of the policy's whole next-token distribution at every trained
token (veRL's ``entropy_from_logits``), averaged over a trajectory's trained tokens. The sampled tokens' negative
log-prob (what the lake stores for free) is a one-sample estimate of the same quantity; this computes it exactly,
with one forward pass over the batch and no gradients.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from ragen_core.training.batch import token_logprobs
from ragen_core.update.rows import TokenRows


class _Tempered(torch.nn.Module):
    """A causal LM whose logits are divided by ``temperature`` (the distribution the sampler drew from)."""

    def __init__(self, model: torch.nn.Module, temperature: float) -> None:
        super().__init__()
        self.model, self.temperature = model, temperature

    def forward(self, **inputs: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.model(**inputs).logits / self.temperature)


@torch.no_grad()
def trajectory_entropy(
    model: torch.nn.Module, rows: TokenRows, pad_id: int, temperature: float = 1.0, batch_size: int = 16
) -> torch.Tensor:
    """(B,) float64: each trajectory's mean over its trained tokens (``loss_mask`` 1) of the entropy of ``model``'s
    full next-token distribution at ``temperature``, ``sum(H_t * mask_t) / max(sum(mask_t), 1)`` as RAGEN-2's
    entropy filter computes it, ``batch_size`` rows a forward pass. Packed rows are scored as their separate
    sequences."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    was_training = model.training
    model.eval()
    tempered = _Tempered(model, temperature)
    device = next(model.parameters()).device
    out = torch.zeros(len(rows), dtype=torch.float64)
    try:
        for start in range(0, len(rows), batch_size):
            stop = min(start + batch_size, len(rows))
            batch = rows.batch(pad_id, start, stop).to(device)
            _, entropy = token_logprobs(tempered, batch, with_entropy=True, entropy_grad=False)
            mask = batch.loss_mask.double()
            sums = (entropy.double() * mask).sum(dim=1)
            out[start:stop] = (sums / mask.sum(dim=1).clamp(min=1.0)).cpu()
    finally:
        model.train(was_training)
    return out
