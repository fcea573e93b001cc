"""Group filters (StarPO-S variance filter): keep the groups whose rollouts disagree most.

Signature: ``fn(scores (B,), group_index (B,), ratio) -> (kept (B,) bool, group_std (B,))``. ``group_std`` is each
trajectory's in-group (unbiased) score std, stored with the trajectory so the decision is auditable.
"""

from __future__ import annotations

import math

import torch

from ragen_core.algos.registry import Registry

FILTERS: Registry = Registry("group filter")
register_filter = FILTERS.register


def in_group_std(scores: torch.Tensor, group_index: torch.Tensor) -> dict[int, float]:
    """Unbiased std of the scores of each group (0.0 for single-member groups)."""
    result = {}
    for group in torch.unique(group_index).tolist():
        members = scores[group_index == group]
        result[int(group)] = float(members.std()) if members.numel() > 1 else 0.0
    return result


def groups_to_keep(ratio: float, num_groups: int) -> int:
    """How many groups a filter keeps: ``int(ratio * num_groups)``, at least one (RAGEN's rule)."""
    return max(1, min(num_groups, int(math.floor(ratio * num_groups + 1e-9))))


def _select(scores: torch.Tensor, group_index: torch.Tensor, ratio: float, highest: bool):
    stds = in_group_std(scores, group_index)
    # Ties break towards the lower group id, so the choice is deterministic.
    order = sorted(stds, key=lambda g: ((-stds[g]) if highest else stds[g], g))
    kept_groups = set(order[: groups_to_keep(ratio, len(order))])
    kept = torch.tensor([int(g) in kept_groups for g in group_index.tolist()], dtype=torch.bool)
    group_std = torch.tensor([stds[int(g)] for g in group_index.tolist()], dtype=torch.float32)
    return kept, group_std


@register_filter("std")
def std_filter(scores: torch.Tensor, group_index: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the top ``ratio`` share of groups by in-group score std (ratio 1.0 keeps all)."""
    return _select(scores, group_index, ratio, highest=True)


@register_filter("std_rev")
def std_rev_filter(scores: torch.Tensor, group_index: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``ratio`` share of groups with the LOWEST in-group std (the ablation of the paper)."""
    return _select(scores, group_index, ratio, highest=False)
