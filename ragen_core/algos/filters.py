"""Group filters (StarPO-S variance filter): keep the groups whose rollouts disagree most.

Signature: ``fn(scores (B,), group_index (B,), ratio) -> (kept (B,) bool, group_std (B,))``. ``group_std`` is each
trajectory's in-group (unbiased) score std, stored with the trajectory so the decision is auditable.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def _select(
    scores: torch.Tensor, group_index: torch.Tensor, count_kept: Callable[[list[float]], int], highest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the first ``count_kept(stds in order)`` groups ordered by std (descending when ``highest``)."""
    stds = in_group_std(scores, group_index)
    # Ties break towards the lower group id, so the choice is deterministic.
    order = sorted(stds, key=lambda g: ((-stds[g]) if highest else stds[g], g))
    kept_groups = set(order[: count_kept([stds[g] for g in order])])
    kept = torch.tensor([int(g) in kept_groups for g in group_index.tolist()], dtype=torch.bool)
    group_std = torch.tensor([stds[int(g)] for g in group_index.tolist()], dtype=torch.float32)
    return kept, group_std


def groups_to_cover(ratio: float, ordered_stds: list[float]) -> int:
    """How many groups, taken in the given (descending-std) order, it takes for their cumulative std to reach
    ``ratio`` of the total std; all of them for ``ratio >= 1``, at least one."""
    if ratio >= 1.0:
        return len(ordered_stds)
    target = ratio * sum(ordered_stds) * (1.0 - 1e-9)  # tolerance: float sums must not miss the target
    covered = 0.0
    for count, std in enumerate(ordered_stds, start=1):
        covered += std
        if covered >= target:
            return count
    return len(ordered_stds)


@register_filter("std")
def std_filter(scores: torch.Tensor, group_index: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the top ``ratio`` share of groups by in-group score std (ratio 1.0 keeps all)."""
    return _select(scores, group_index, lambda stds: groups_to_keep(ratio, len(stds)), highest=True)


@register_filter("std_rev")
def std_rev_filter(scores: torch.Tensor, group_index: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``ratio`` share of groups with the LOWEST in-group std (the ablation of the paper)."""
    return _select(scores, group_index, lambda stds: groups_to_keep(ratio, len(stds)), highest=False)


@register_filter("std_top_p")
def std_top_p_filter(
    scores: torch.Tensor, group_index: torch.Tensor, ratio: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p by std: keep groups in descending in-group std until their cumulative std covers at least ``ratio``
    (= p) of the batch's total std (ratio 1.0 keeps all; at least one group)."""
    return _select(scores, group_index, lambda stds: groups_to_cover(ratio, stds), highest=True)
