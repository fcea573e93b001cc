import math
import statistics

import pytest
import torch

from ragen_core.algos import (
    apply_filter,
    explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    place_turn_rewards,
    turn_ends,
    turn_index,
    turn_starts,
    turn_sums,
    value_metrics,
)
from tests.algos.filter_config import filter_section
from tests.algos.loop_twins import runs, whiten


def _alias_filter(name, scores, groups, ratio):
    """``algorithm.filter=name`` at ``ratio`` through the filter registry: (kept, group reward std) per row."""
    decision = apply_filter(filter_section(name, ratio), groups, scores)
    return decision.kept, decision.group_reward_std


def _groups_with_spreads(spreads: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Group g holds the scores (0, spreads[g]), so its std is spreads[g] / sqrt(2)."""
    scores = torch.tensor([v for d in spreads for v in (0.0, d)], dtype=torch.float64)
    groups = torch.tensor([g for g in range(len(spreads)) for _ in range(2)])
    return scores, groups


def _kept_groups(kept: torch.Tensor, groups: torch.Tensor) -> list[int]:
    return sorted(set(groups[kept].tolist()))


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [(0.4, [0]), (0.41, [0]), (0.42, [0, 2]), (0.5, [0, 2]), (0.75, [0, 2, 3]), (0.01, []), (1.0, [0, 1, 2, 3])],
)
def test_std_top_p_hand_computed(ratio, expected):
    # spreads 4, 1, 3, 2 (/10): stds .2828 .0707 .2121 .1414 (total .7071), descending order 0, 2, 3, 1; the target is
    # ratio * .7071 - 0.01: 0.41 -> .2799 (group 0 alone), 0.42 -> .2870 (two groups), 0.75 -> .5203 (.2828 + .2121
    # + .1414), 0.01 -> -.0029, met before any group is added, so nothing is kept (RAGEN's rule)
    scores, groups = _groups_with_spreads([0.4, 0.1, 0.3, 0.2])
    kept, group_std = _alias_filter("std_top_p", scores, groups, ratio)
    assert _kept_groups(kept, groups) == expected
    assert float(group_std[2]) == pytest.approx(0.1 / math.sqrt(2))


def test_std_top_p_ties_and_zero_spread():
    # equal stds: the lower group id comes first; with no spread anywhere nothing is kept (RAGEN's empty batch)
    scores, groups = _groups_with_spreads([0.2, 0.2, 0.2, 0.2])
    assert _kept_groups(_alias_filter("std_top_p", scores, groups, 0.5)[0], groups) == [0, 1]
    scores, groups = _groups_with_spreads([0.0, 0.0, 0.0])
    assert _kept_groups(_alias_filter("std_top_p", scores, groups, 0.5)[0], groups) == []
    assert _kept_groups(_alias_filter("std_top_p", scores, groups, 1.0)[0], groups) == [0, 1, 2]


def _stds(scores: list[float], groups: list[int]) -> dict[int, float]:
    stds = {}
    for g in sorted(set(groups)):
        members = [s for s, h in zip(scores, groups, strict=True) if h == g]
        stds[g] = statistics.stdev(members) if len(members) > 1 else 0.0
    return stds


def _linear_loop(stds: dict[int, float], p: float, eps: float = 0.01) -> set[int]:
    """RAGEN's linear top-p rule written out: add groups in descending std until the target is met."""
    if p >= 1.0:
        return set(stds)
    target = p * math.fsum(stds.values()) - eps
    kept, covered = [], 0.0
    for g in sorted(stds, key=lambda h: (-stds[h], h)):
        if covered >= target or stds[g] <= 0:
            break
        kept.append(g)
        covered += stds[g]
    return set(kept) if covered >= target else set()


def _softmax_loop(stds: dict[int, float], p: float) -> set[int]:
    if p >= 1.0:
        return set(stds)
    weights = {g: math.exp(v) for g, v in stds.items()}
    total = math.fsum(weights.values())
    kept, mass = [], 0.0
    for g in sorted(stds, key=lambda h: (-stds[h], h)):
        kept.append(g)
        mass += weights[g] / total
        if mass >= p - 1e-12:
            break
    return set(kept)


def _min_p_loop(stds: dict[int, float], p: float) -> set[int]:
    best = max(stds.values())
    return {g for g, v in stds.items() if v >= best * p - 1e-10}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_std_strategies_match_loop_twins(seed, p):
    generator = torch.Generator().manual_seed(seed)
    groups = torch.randint(0, 6, (30,), generator=generator)
    scores = torch.randn(30, generator=generator, dtype=torch.float64)
    stds = _stds(scores.tolist(), groups.tolist())
    for spec, expected in (
        (filter_section("top_p", p), _linear_loop(stds, p)),
        (filter_section("top_p", p, top_p_mode="softmax"), _softmax_loop(stds, p)),
        (filter_section("min_p", p), _min_p_loop(stds, p)),
    ):
        kept = apply_filter(spec, groups, scores).kept
        assert set(_kept_groups(kept, groups)) == expected, spec
        assert kept.tolist() == [g in expected for g in groups.tolist()]


def test_masked_statistics_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert float(masked_mean(values, mask)) == pytest.approx(2.0)
    assert float(masked_var(values, mask)) == pytest.approx(1.0)
    assert float(masked_var(values, mask, unbiased=False)) == pytest.approx(2 / 3)
    assert masked_whiten(values, mask).tolist() == [[pytest.approx(-1.0), 0.0, pytest.approx(1.0), 0.0]]


def test_explained_variance_hand_computed():
    # residuals 0, 0, 1: sample var 1/3; Var(returns) = 1 -> 1 - 1/3
    returns = torch.tensor([[1.0, 2.0, 3.0, 5.0]])
    values = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert float(explained_variance(returns, values, mask)) == pytest.approx(2 / 3, rel=1e-4)
    metrics = value_metrics(values, returns, mask)
    assert metrics["critic/values_mean"] == pytest.approx(5 / 3)
    assert metrics["critic/returns_mean"] == pytest.approx(2.0)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(5))
def test_whiten_and_explained_variance_match_loop_twins(seed):
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(6, 8, generator=generator) > 0.4).double()
    returns = torch.randn(6, 8, generator=generator, dtype=torch.float64)
    values = returns + 0.5 * torch.randn(6, 8, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(
        masked_whiten(returns, mask), torch.tensor(whiten(returns.tolist(), mask.tolist()), dtype=torch.float64)
    )
    on = mask.flatten() > 0
    residual = (returns - values).flatten()[on].tolist()
    expected = 1 - statistics.variance(residual) / (statistics.variance(returns.flatten()[on].tolist()) + 1e-5)
    assert float(explained_variance(returns, values, mask)) == pytest.approx(expected, rel=1e-10)


def test_turn_structure_hand_computed():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert turn_starts(mask).int().tolist() == [[0, 1, 0, 0, 1], [1, 0, 0, 0, 0], [0] * 5]
    assert turn_ends(mask).int().tolist() == [[0, 0, 1, 0, 1], [1, 0, 0, 0, 0], [0] * 5]
    assert turn_index(mask).tolist() == [[-1, 0, 0, -1, 1], [0, -1, -1, -1, -1], [-1] * 5]
    sums, valid = turn_sums(torch.tensor([[9.0, 1.0, 2.0, 9.0, 3.0], [4.0, 9.0, 9.0, 9.0, 9.0], [9.0] * 5]), mask)
    assert sums.tolist() == [[3.0, 3.0], [4.0, 0.0], [0.0, 0.0]]
    assert valid.tolist() == [[True, True], [True, False], [False, False]]


def test_place_turn_rewards():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    rewards = place_turn_rewards(mask, [[0.5, 1.0], [-1.0]])
    assert rewards.tolist() == [[0.0, 0.0, 0.5, 0.0, 1.0], [0.0, 0.0, -1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="row 1: 2 turn rewards but the response mask has 1 turns"):
        place_turn_rewards(mask, [[0.5, 1.0], [1.0, 2.0]])


@pytest.mark.parametrize("seed", range(5))
def test_turn_sums_match_loop_twin(seed):
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(7, 11, generator=generator) > 0.5).double()
    values = torch.randn(7, 11, generator=generator, dtype=torch.float64)
    sums, valid = turn_sums(values, mask)
    for row in range(7):
        turns = runs(mask[row].tolist())
        expected = [sum(float(values[row, t]) for t in turn) for turn in turns]
        assert sums[row, : len(turns)].tolist() == pytest.approx(expected)
        assert valid[row].tolist() == [k < len(turns) for k in range(sums.shape[1])]
        assert bool((sums[row, len(turns) :] == 0).all())
