"""Group filters, as RAGEN-2 selects rollout groups: a strategy over one value per group.

Each group (the members that share an initial state) gets one value of ``algorithm.filter_metric``: the in-group std of
the trajectory scores (``reward_std``), their mean (``reward``) or sum (``reward_sum``), the mean or the in-group
std of the per-trajectory entropy (``entropy``, ``entropy_variance``: a trajectory's entropy is the mean over its
sampled tokens of either the sampled token's negative behaviour log-prob or the full distribution's entropy, see
``algorithm.filter_entropy``) or the mean number of sampled tokens (``length``). A strategy then keeps some groups,
ranked by that value (largest first unless ``largest=False``); ``value`` is ``algorithm.filter_ratio``:

- ``top_k``: the first ``int(value * groups)`` groups, at least one;
- ``top_k_abs``: the first ``int(value)`` groups, at least one;
- ``top_p``, ``linear`` mode: the shortest prefix whose values sum to at least ``value * total - eps``; a group whose
  value is <= 0 ends the prefix, and when the prefix cannot reach the threshold (or the threshold is <= 0 and no
  group was needed) nothing is kept;
- ``top_p``, ``softmax`` mode: the shortest prefix whose softmax probabilities (of the values, or of their
  negatives when ``largest=False``) sum to at least ``value``;
- ``min_p``: every group with value >= ``value * max`` (``largest``) or <= ``min / value`` (``largest=False``).

A strategy is registered in :data:`STRATEGIES` with the ``algorithm`` fields it reads declared as its options
(``options={"ratio": "filter_ratio"}``); :func:`select_groups` calls it through the registry with the config's
section, so a filter setting is said at the strategy and at the config field only.

``value >= 1`` keeps every candidate under ``top_p``. With ``include_zero=False`` the groups whose value is zero
(``|value| <= 1e-10``: for ``reward_std`` the groups whose rewards do not vary) are no candidates at all, as in
RAGEN-2's code (which tests the selection score, whatever the metric). Ties in rank go to the lower group id, so
every choice is deterministic. The aliases ``std``, ``std_rev`` and ``std_top_p`` are ``top_k`` (largest), ``top_k``
(smallest) and ``top_p`` (linear) over ``reward_std``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ragen_core.registry import Registry

ZERO_SCORE = 1e-10  # include_zero=False: a group whose selection score is at most this in magnitude is dropped
MIN_P_TOL = 1e-10  # RAGEN's slack on the min-p threshold
CUMULATIVE_TOL = 1e-12  # float sums of probabilities must not miss an exactly reachable top-p target
FILTER_METRICS = ("reward_std", "reward", "reward_sum", "entropy", "entropy_variance", "length")
ENTROPY_METRICS = ("entropy", "entropy_variance")  # need a per-trajectory entropy
TOP_P_MODES = ("linear", "softmax")


# alias -> what it fixes: the strategy, the direction and the top-p mode (the metric is always reward_std)
FILTER_ALIASES: dict[str, dict[str, object]] = {
    "std": {"strategy": "top_k", "largest": True},
    "std_rev": {"strategy": "top_k", "largest": False},
    "std_top_p": {"strategy": "top_p", "largest": True, "top_p_mode": "linear"},
}

# (candidates {group: value}, largest, number of groups, **options) -> kept groups
Strategy = Callable[..., list[int]]
STRATEGIES: Registry[Strategy] = Registry("filter strategy")
register_strategy = STRATEGIES.register


class FilterSettings(Protocol):
    """What the filter reads of the ``algorithm`` config section (:class:`ragen_core.config.AlgorithmConfig`); the
    strategies read their declared options from it too."""

    filter: str
    filter_metric: str
    filter_largest: bool | None
    filter_include_zero: bool


def filter_names() -> list[str]:
    """Every name ``algorithm.filter`` accepts: the strategies and the aliases."""
    return sorted([*STRATEGIES.names(), *FILTER_ALIASES])


def filter_strategy(name: str) -> str:
    """The registered strategy ``algorithm.filter=name`` runs (an alias's, or the name itself)."""
    alias = FILTER_ALIASES.get(name)
    return str(alias["strategy"]) if alias is not None else name


def filter_metric(algorithm: FilterSettings) -> str:
    """The metric the filter ranks: ``algorithm.filter_metric`` (an alias ranks ``reward_std``)."""
    return "reward_std" if algorithm.filter in FILTER_ALIASES else algorithm.filter_metric


def keeps_largest(algorithm: FilterSettings) -> bool:
    """Whether the filter keeps the largest values: ``algorithm.filter_largest``, or when unset the alias's direction
    (``std_rev``: smallest), else largest."""
    if algorithm.filter_largest is not None:
        return algorithm.filter_largest
    return bool(FILTER_ALIASES.get(algorithm.filter, {}).get("largest", True))


def check_filter_options(name: str, value: float, metric: str, largest: bool | None, top_p_mode: str) -> None:
    """Raise ``ValueError`` (naming the config keys and the fix) when the filter keys do not fit together."""
    if name not in filter_names():
        raise ValueError(f"algorithm.filter={name!r} is not a filter; use one of {', '.join(filter_names())}")
    alias = FILTER_ALIASES.get(name)
    strategy = filter_strategy(name)
    if alias is not None:
        if metric != "reward_std":
            raise ValueError(
                f"algorithm.filter={name} ranks groups by reward_std; to rank by {metric} set "
                f"algorithm.filter={strategy}"
            )
        if largest is not None and largest != alias["largest"]:
            raise ValueError(
                f"algorithm.filter={name} already keeps the {'largest' if alias['largest'] else 'smallest'} std; "
                f"set algorithm.filter={strategy} to choose algorithm.filter_largest yourself"
            )
        if name == "std_top_p" and top_p_mode != "linear":
            raise ValueError(
                "algorithm.filter=std_top_p is top_p in linear mode; for softmax set algorithm.filter=top_p"
            )
    if strategy == "top_k_abs" and value != int(value):
        raise ValueError(
            f"algorithm.filter_ratio={value:g}: filter top_k_abs keeps that many groups, so it must be a whole number "
            ">= 1 (for a share of the groups use algorithm.filter=top_k)"
        )
    if strategy != "top_k_abs" and not 0 < value <= 1:
        raise ValueError(
            f"algorithm.filter_ratio={value:g}: filter {name} needs a value in (0, 1] (1.0 keeps every group under "
            "top_k and top_p); to keep a number of groups use algorithm.filter=top_k_abs"
        )
    if top_p_mode == "softmax" and strategy != "top_p":
        raise ValueError(f"algorithm.filter_top_p_mode=softmax only applies to algorithm.filter=top_p, not {name}")


def ranked(values: dict[int, float], largest: bool) -> list[int]:
    """Group ids by value (descending when ``largest``), ties to the lower group id."""
    return sorted(values, key=lambda g: (-values[g] if largest else values[g], g))


def groups_to_keep(ratio: float, num_groups: int) -> int:
    """How many groups ``top_k`` keeps: ``int(ratio * num_groups)``, at least one (RAGEN's rule; the 1e-9 guards
    products such as 0.29 * 100 that land just below an integer)."""
    return max(1, min(num_groups, int(math.floor(ratio * num_groups + 1e-9))))


@register_strategy("top_k", options={"share": "filter_ratio"})
def top_k(values: dict[int, float], largest: bool, num_groups: int, share: float) -> list[int]:
    """The first ``int(share * num_groups)`` candidates (counted over all groups), at least one."""
    return ranked(values, largest)[: groups_to_keep(share, num_groups)]


@register_strategy("top_k_abs", options={"count": "filter_ratio"})
def top_k_abs(values: dict[int, float], largest: bool, num_groups: int, count: float) -> list[int]:
    """The first ``int(count)`` candidates, at least one."""
    return ranked(values, largest)[: max(1, int(count))]


@register_strategy("top_p", options={"p": "filter_ratio", "mode": "filter_top_p_mode", "eps": "filter_eps"})
def top_p(values: dict[int, float], largest: bool, num_groups: int, p: float, mode: str, eps: float) -> list[int]:
    """Nucleus-style selection over the values (linear mass) or their softmax probabilities."""
    order = ranked(values, largest)
    if p >= 1.0:
        return order
    if mode == "softmax":
        return order[: softmax_prefix([values[g] for g in order], p, largest)]
    if mode == "linear":
        return order[: linear_prefix([values[g] for g in order], p, eps)]
    raise ValueError(f"unknown top_p mode {mode!r}; use one of {', '.join(TOP_P_MODES)}")


def softmax_prefix(ordered: list[float], p: float, largest: bool) -> int:
    """Length of the shortest prefix whose softmax probability mass reaches ``p`` (all of them if none does)."""
    logits = torch.tensor(ordered if largest else [-v for v in ordered], dtype=torch.float64)
    cumulative = torch.cumsum(torch.softmax(logits, dim=0), dim=0).tolist()
    for count, mass in enumerate(cumulative, start=1):
        if mass >= p - CUMULATIVE_TOL:
            return count
    return len(ordered)


def linear_prefix(ordered: list[float], p: float, eps: float) -> int:
    """RAGEN's linear top-p: accumulate values in order until they reach ``p * total - eps``; a value <= 0 stops
    the accumulation. Returns the prefix length, or 0 (keep nothing) when the threshold was not reached."""
    threshold = p * math.fsum(ordered) - eps
    covered, count = 0.0, 0
    for value in ordered:
        if covered >= threshold or value <= 0:
            break
        covered += value
        count += 1
    return count if covered >= threshold else 0


@register_strategy("min_p", options={"factor": "filter_ratio"})
def min_p(values: dict[int, float], largest: bool, num_groups: int, factor: float) -> list[int]:
    """Groups within a ``factor`` of the best: ``v >= factor * max - tol`` (largest) or
    ``v <= min / (factor + tol) + tol``, in float32 as RAGEN-2 computes it: there the slack ``tol`` (1e-10) rounds
    away next to values far from 0, so the group at the minimum is always kept (in float64 the division by
    ``1 + 1e-10`` moved the threshold just below a minimum above 1, and nothing was kept)."""
    order = ranked(values, largest)
    scores = torch.tensor([values[g] for g in order], dtype=torch.float32)
    if largest:
        mask = scores >= scores.max() * factor - MIN_P_TOL
    else:
        mask = scores <= scores.min() / (factor + MIN_P_TOL) + MIN_P_TOL
    return [g for g, keep in zip(order, mask.tolist(), strict=True) if keep]


def select_groups(values: dict[int, float], algorithm: FilterSettings) -> set[int]:
    """The kept group ids, ``values`` being each group's metric value, by the strategy ``algorithm.filter`` names
    (its options read from ``algorithm``). With ``filter_include_zero=False`` the groups whose value is zero
    (``|value| <= 1e-10`` in float32, RAGEN-2's test on the selection score) are no candidates."""
    candidates = values
    if not algorithm.filter_include_zero:
        magnitude = torch.tensor(list(values.values()), dtype=torch.float32).abs().tolist()
        candidates = {g: v for (g, v), m in zip(values.items(), magnitude, strict=True) if m > ZERO_SCORE}
    if not candidates:
        return set()
    strategy = filter_strategy(algorithm.filter)
    return set(STRATEGIES.call(strategy, algorithm, candidates, keeps_largest(algorithm), len(values)))


def in_group_std(scores: torch.Tensor, group_index: torch.Tensor) -> dict[int, float]:
    """Unbiased std of the scores of each group (0.0 for single-member groups)."""
    return {g: float(m.std()) if m.numel() > 1 else 0.0 for g, m in _members(scores, group_index).items()}


def in_group_mean(values: torch.Tensor, group_index: torch.Tensor) -> dict[int, float]:
    """Mean of the values of each group."""
    return {g: float(m.double().mean()) for g, m in _members(values, group_index).items()}


def in_group_sum(values: torch.Tensor, group_index: torch.Tensor) -> dict[int, float]:
    """Sum of the values of each group (RAGEN-2's ``reward_sum``)."""
    return {g: float(m.double().sum()) for g, m in _members(values, group_index).items()}


def _members(values: torch.Tensor, group_index: torch.Tensor) -> dict[int, torch.Tensor]:
    return {int(g): values[group_index == g] for g in torch.unique(group_index).tolist()}


@dataclass(frozen=True)
class FilterDecision:
    """Per trajectory: kept or not, its group's reward std and its group's metric value (what was ranked)."""

    kept: torch.Tensor  # (B,) bool
    group_reward_std: torch.Tensor  # (B,) float64
    metric_value: torch.Tensor  # (B,) float64


def apply_filter(
    algorithm: FilterSettings,
    group_index: torch.Tensor,
    scores: torch.Tensor,
    entropy: torch.Tensor | None = None,
    length: torch.Tensor | None = None,
) -> FilterDecision:
    """Filter one batch by the ``algorithm`` section's filter: per-trajectory ``scores`` (and ``entropy`` / ``length``
    for those metrics) -> decisions."""
    stds = in_group_std(scores.double(), group_index)
    values = group_metric(filter_metric(algorithm), group_index, scores, stds, entropy, length)
    kept_groups = select_groups(values, algorithm)
    rows = [int(g) for g in group_index.tolist()]
    return FilterDecision(
        kept=torch.tensor([g in kept_groups for g in rows], dtype=torch.bool),
        group_reward_std=torch.tensor([stds[g] for g in rows], dtype=torch.float64),
        metric_value=torch.tensor([values[g] for g in rows], dtype=torch.float64),
    )


def group_metric(
    metric: str,
    group_index: torch.Tensor,
    scores: torch.Tensor,
    stds: dict[int, float],
    entropy: torch.Tensor | None,
    length: torch.Tensor | None,
) -> dict[int, float]:
    """Each group's value of ``metric`` (``stds``: the groups' reward std, already computed). The std-based metrics
    are unbiased stds, 0 for a one-member group (RAGEN-2's ``torch.std`` would give nan there)."""
    if metric == "reward_std":
        return stds
    if metric == "reward":
        return in_group_mean(scores, group_index)
    if metric == "reward_sum":
        return in_group_sum(scores.double(), group_index)
    if metric not in FILTER_METRICS:
        raise ValueError(f"unknown filter metric {metric!r}; use one of {', '.join(FILTER_METRICS)}")
    per_trajectory = length if metric == "length" else entropy
    if per_trajectory is None:
        needed = "length" if metric == "length" else "entropy"
        raise ValueError(f"filter metric {metric!r} needs the per-trajectory {needed} of every row")
    if metric == "entropy_variance":
        return in_group_std(per_trajectory.double(), group_index)
    return in_group_mean(per_trajectory, group_index)
