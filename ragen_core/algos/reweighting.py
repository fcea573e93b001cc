"""RAGEN-2's advantage scalings around the group filter: soft reweighting by reward variance, and the loss scaling
by the share of groups the filter kept. Both multiply the advantages before the policy loss (as RAGEN-2 does, so
the loss, the clipping and the aggregation are unchanged)."""

from __future__ import annotations

import math

import torch

from ragen_core.algos.advantages import group_mean_std

FILTER_LOSS_SCALINGS = ("none", "linear", "sqrt")


def soft_advantage_weights(
    scores: torch.Tensor, group_index: torch.Tensor, episode_index: torch.Tensor | None = None, epsilon: float = 1e-6
) -> torch.Tensor:
    """(B,) RAGEN-2's soft advantage weight of each trajectory: its group's reward std over the largest group std of
    the batch, ``std_g / (max_g std_g + epsilon)``. The std is GRPO's (unbiased; a one-member group counts 1.0, as
    veRL's GRPO sets it), so a group whose rewards do not vary gets weight 0 instead of being filtered out. With
    ``episode_index`` (turn rows) the std counts each episode once, as GRPO's does then."""
    _, std = group_mean_std(scores.double(), group_index, episode_index)  # (B,) each row's group std
    return (std / (std.max() + epsilon)).to(scores.dtype)


def filter_loss_scale(mode: str, kept_share: float) -> float:
    """RAGEN-2's ``filter_loss_scaling``: the factor on every advantage given the share of groups the filter kept:
    1 (``none``), ``kept_share`` (``linear``) or its square root (``sqrt``)."""
    if not 0.0 <= kept_share <= 1.0:
        raise ValueError(f"kept_share must be in [0, 1], got {kept_share}")
    if mode == "none":
        return 1.0
    if mode == "linear":
        return kept_share
    if mode == "sqrt":
        return math.sqrt(kept_share)
    raise ValueError(f"unknown filter_loss_scaling {mode!r}; use one of {', '.join(FILTER_LOSS_SCALINGS)}")
