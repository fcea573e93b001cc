"""Advantage estimators: pure functions over token-level tensors, registered by name.

One signature for all: ``fn(token_rewards (B, T), response_mask (B, T), group_index (B,), **options)
-> (advantages (B, T), returns (B, T))``. Trajectory rewards sit on the last assistant token, so a trajectory's
score is ``token_rewards.sum(-1)``.
"""

from __future__ import annotations

import torch

from ragen_core.algos.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")
register_advantage = ADVANTAGES.register


def group_mean_std(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-trajectory mean and (unbiased) std of its group's scores; single-member groups get mean 0, std 1
    (as veRL does), so their advantage is the raw score."""
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    for group in torch.unique(group_index):
        members = group_index == group
        if int(members.sum()) > 1:
            mean[members] = scores[members].mean()
            std[members] = scores[members].std()
    return mean, std


@register_advantage("grpo")
def grpo_advantage(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each trajectory's score minus its group's mean (divided by the group's std when ``norm_adv_by_std``),
    broadcast to every response token."""
    scores = token_rewards.sum(dim=-1)  # (B,)
    mean, std = group_mean_std(scores, group_index)
    advantage = scores - mean
    if norm_adv_by_std:
        advantage = advantage / (std + epsilon)
    advantages = advantage.unsqueeze(-1) * response_mask  # (B, T)
    return advantages, advantages
