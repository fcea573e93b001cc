"""Each group-filter strategy against selections computed by hand (ties, zero-variance groups, empty results), the
metrics it ranks, and the config rules that reject filter keys which do not fit together."""

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from ragen_core.algos import (
    FILTER_ALIASES,
    apply_filter,
    filter_metric,
    filter_strategy,
    keeps_largest,
    select_groups,
)
from ragen_core.config import ConfigError
from ragen_core.run.batches import filter_inputs
from ragen_core.run.checks import build_run_config as build_config
from tests.algos.filter_config import filter_section


def _alias_filter(name, scores, groups, ratio):
    """``algorithm.filter=name`` at ``ratio`` through the filter registry: (kept, group reward std) per row."""
    decision = apply_filter(filter_section(name, ratio), groups, scores)
    return decision.kept, decision.group_reward_std


# metric values with total 1.0: ranked largest first 0 (.4), 2 (.3), 3 (.2), 1 (.1)
VALUES = {0: 0.4, 1: 0.1, 2: 0.3, 3: 0.2}
VARYING = {g: 1.0 for g in VALUES}  # reward std of each group: all vary


def _select(values, strategy, value, **options):
    return sorted(select_groups(values, filter_section(strategy=strategy, value=value, **options)))


@pytest.mark.parametrize(
    ("value", "largest", "expected"),
    [(0.5, True, [0, 2]), (0.5, False, [1, 3]), (0.25, True, [0]), (0.01, True, [0]), (1.0, True, [0, 1, 2, 3])],
)
def test_top_k_keeps_a_share_of_the_groups(value, largest, expected):
    # int(value * 4) groups, at least one
    assert _select(VALUES, "top_k", value, largest=largest) == expected


def test_top_k_ties_go_to_the_lower_group_id():
    tied = {0: 0.2, 1: 0.3, 2: 0.3, 3: 0.1}
    assert _select(tied, "top_k", 0.25) == [1]
    assert _select(tied, "top_k", 0.5) == [1, 2]
    assert _select({0: 0.3, 1: 0.3, 2: 0.3}, "top_k", 0.34) == [0]  # int(1.02) = 1 of three equal groups
    assert _select(tied, "top_k", 0.5, largest=False) == [0, 3]  # 0.1, then 0.2


@pytest.mark.parametrize(
    ("count", "largest", "expected"), [(3, True, [0, 2, 3]), (10, True, [0, 1, 2, 3]), (1, False, [1])]
)
def test_top_k_abs_keeps_a_number_of_groups(count, largest, expected):
    assert _select(VALUES, "top_k_abs", count, largest=largest) == expected


@pytest.mark.parametrize(
    ("p", "eps", "expected"),
    [
        (0.5, 0.01, [0, 2]),  # threshold 0.49: 0.4 is short, 0.4 + 0.3 reaches it
        (0.41, 0.01, [0]),  # threshold 0.40: group 0 alone reaches it (without eps it would take two groups)
        (0.41, 0.0, [0, 2]),
        (0.4, 0.0, [0]),  # exactly reached counts
        (0.9, 0.01, [0, 2, 3]),  # threshold 0.89: .4 .7 .9
        (1.0, 0.01, [0, 1, 2, 3]),
    ],
)
def test_top_p_linear_hand_computed(p, eps, expected):
    assert _select(VALUES, "top_p", p, eps=eps) == expected


def test_top_p_linear_empty_and_non_positive_cases():
    # every group without variance: the threshold -eps is met by no group at all, so nothing is kept (RAGEN skips)
    assert _select({0: 0.0, 1: 0.0}, "top_p", 0.5) == []
    assert _select({0: 0.0, 1: 0.0}, "top_p", 1.0) == [0, 1]  # p = 1 keeps every candidate
    # a value <= 0 ends the accumulation: smallest-first meets the zero group first and never reaches the target
    zeros = {0: 0.5, 1: 0.0, 2: 0.0}
    assert _select(zeros, "top_p", 0.9) == [0]
    assert _select(zeros, "top_p", 0.9, largest=False) == []
    # without the zero-valued groups the smallest-first prefix works: threshold 0.9 * 0.5 - 0.01 = 0.44
    assert _select(zeros, "top_p", 0.9, largest=False, include_zero=False) == [0]
    # negative values (metric 'reward'): total 0.5, threshold 0.24, reached by group 0
    assert _select({0: 1.0, 1: -0.5}, "top_p", 0.5) == [0]


@pytest.mark.parametrize(
    ("p", "largest", "expected"),
    [
        (0.5, True, [0, 2]),  # probabilities 0.4, 0.1, 0.3, 0.2: 0.4 then 0.7
        (0.4, True, [0]),
        (0.95, True, [0, 1, 2, 3]),  # 0.4 .7 .9 1.0
        (0.5, False, [1, 3]),  # softmax of -log v: proportional to 1/v = 2.5, 10, 3.33, 5 -> 0.48 (1), 0.72 (+3)
    ],
)
def test_top_p_softmax_hand_computed(p, largest, expected):
    logits = {g: math.log(v) for g, v in VALUES.items()}  # softmax(log v) = v / sum(v)
    assert _select(logits, "top_p", p, top_p_mode="softmax", largest=largest) == expected


def test_top_p_softmax_ties():
    equal = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}  # 0.25 each
    assert _select(equal, "top_p", 0.5, top_p_mode="softmax") == [0, 1]
    assert _select(equal, "top_p", 0.6, top_p_mode="softmax") == [0, 1, 2]


def test_min_p_hand_computed():
    assert _select(VALUES, "min_p", 0.5) == [0, 2, 3]  # >= 0.5 * 0.4: the 0.2 on the threshold is kept
    assert _select(VALUES, "min_p", 1.0) == [0]
    assert _select(VALUES, "min_p", 0.5, largest=False) == [1, 3]  # <= 0.1 / 0.5
    assert _select({0: 0.3, 1: 0.3, 2: 0.1}, "min_p", 1.0) == [0, 1]  # ties with the maximum


def test_min_p_keeps_the_minimum_above_one():
    # RAGEN-2 computes the threshold in float32, where min / (1 + 1e-10) + 1e-10 is the minimum itself; in float64 it
    # fell just below a minimum above 1 and nothing was kept
    assert _select({0: 1.6, 1: 1.62, 2: 1.5, 3: 1.01}, "min_p", 1.0, largest=False) == [3]
    assert _select({0: 1.6, 1: 1.62, 2: 1.5, 3: 1.01}, "min_p", 1.0) == [1]


def test_include_zero_drops_groups_whose_selection_score_is_zero():
    values = {0: 0.0, 1: 0.3, 2: 0.0, 3: 0.1}
    assert _select(values, "top_k", 0.5, largest=False) == [0, 2]
    assert _select(values, "top_k", 0.5, largest=False, include_zero=False) == [1, 3]
    assert _select(values, "top_k", 1.0, include_zero=False) == [1, 3]
    assert _select({0: 0.0, 1: 0.0}, "min_p", 0.1, include_zero=False) == []
    # RAGEN-2 tests the ranked value, whatever the metric: a zero mean reward is dropped, an all-success group kept
    assert _select({0: 0.0, 1: 0.5}, "top_k", 1.0, metric="reward", include_zero=False) == [1]
    assert _select({0: 1e-11, 1: -2e-10}, "top_k", 1.0, metric="reward", include_zero=False) == [1]


def _ragen2_select(
    scores: list[float], strategy: str, value: float, largest: bool, include_zero: bool, mode: str, eps: float
) -> list[int]:
    """Our port of RAGEN-2's group selection (ragen/trainer/rollout_filter.py, _select_top_groups, at its HEAD of
    2026-04): float32 scores, the zero test on the score, then the strategy; the group ids kept, sorted."""
    tensor = torch.tensor(scores, dtype=torch.float32)
    ids = torch.arange(len(scores))
    if not include_zero:
        nonzero = tensor.abs() > 1e-10
        tensor, ids = tensor[nonzero], ids[nonzero]
        if ids.numel() == 0:
            return []
    if strategy == "top_p":
        if value >= 1.0:
            return sorted(ids.tolist())
        if mode == "softmax":
            probs = torch.softmax(tensor if largest else -tensor, dim=0)
            ordered, order = torch.sort(probs, descending=True, stable=True)
            k = min(int(torch.searchsorted(torch.cumsum(ordered, dim=0), value)) + 1, ids.numel())
            return sorted(ids[order[:k]].tolist())
        ordered, order = torch.sort(tensor, descending=largest, stable=True)
        threshold = value * tensor.sum() - eps
        total, count = 0.0, 0
        for score in ordered:
            if total >= threshold or score.item() <= 0:
                break
            total += score.item()
            count += 1
        return sorted(ids[order[:count]].tolist()) if total >= threshold else []
    if strategy == "min_p":
        if largest:
            mask = tensor >= tensor.max() * value - 1e-10
        else:
            mask = tensor <= tensor.min() / (value + 1e-10) + 1e-10
        return sorted(ids[mask].tolist())
    ordered, order = torch.sort(tensor, descending=largest, stable=True)
    k = max(1, int(value * len(scores))) if strategy == "top_k" else max(1, int(value))
    return sorted(ids[order[: min(k, ids.numel())]].tolist())


@pytest.mark.parametrize("strategy", ["top_k", "top_k_abs", "top_p", "min_p"])
def test_every_strategy_selects_as_ragen2_on_random_cases(strategy):
    rng = np.random.default_rng({"top_k": 0, "top_k_abs": 1, "top_p": 2, "min_p": 3}[strategy])
    compared = 0
    for case in range(1500):
        groups = int(rng.integers(2, 9))
        kind = case % 3  # small rewards with zeros, values around 1 and above, signed means
        if kind == 0:
            scores = [float(v) if rng.random() < 0.7 else 0.0 for v in rng.uniform(0, 1, groups)]
        elif kind == 1:
            scores = [float(v) for v in rng.uniform(0.9, 2.0, groups)]
        else:
            scores = [float(v) for v in rng.normal(0, 1, groups)]
        scores = [float(np.float32(v)) for v in scores]  # exactly representable: the ranks agree in both dtypes
        if len(set(scores)) < len(scores):
            continue  # ties: we break them by group id, RAGEN-2 by its sort; both are deterministic
        shares = [0.25, 0.5, 0.9, 1.0]
        value = float(rng.integers(1, groups + 1)) if strategy == "top_k_abs" else float(rng.choice(shares))
        largest, include_zero = bool(rng.random() < 0.7), bool(rng.random() < 0.5)
        mode = "softmax" if strategy == "top_p" and rng.random() < 0.3 else "linear"
        spec = filter_section(strategy, value, largest=largest, include_zero=include_zero, top_p_mode=mode)
        ours = sorted(select_groups(dict(enumerate(scores)), spec))
        assert ours == _ragen2_select(scores, strategy, value, largest, include_zero, mode, 0.01), (scores, spec)
        compared += 1
    assert compared > 1000


def _batch():
    # group 0: scores 0, 1 (std 0.7071, mean 0.5); group 1: 1, 1 (std 0, mean 1); group 2: -1, 0 (std .7071, mean -.5)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    scores = torch.tensor([0.0, 1.0, 1.0, 1.0, -1.0, 0.0], dtype=torch.float64)
    entropy = torch.tensor([1.0, 3.0, 0.5, 0.5, 4.0, 4.0], dtype=torch.float64)  # group means 2, 0.5, 4
    length = torch.tensor([10, 20, 5, 5, 7, 9], dtype=torch.float64)  # group means 15, 5, 8
    return groups, scores, entropy, length


@pytest.mark.parametrize(
    ("metric", "largest", "group_values", "kept_groups"),
    [
        ("reward_std", True, [math.sqrt(0.5), 0.0, math.sqrt(0.5)], [0]),  # tie between 0 and 2: lower id
        ("reward", True, [0.5, 1.0, -0.5], [1]),
        ("entropy", True, [2.0, 0.5, 4.0], [2]),
        ("length", False, [15.0, 5.0, 8.0], [1]),
    ],
)
def test_each_metric_is_ranked_per_group(metric, largest, group_values, kept_groups):
    groups, scores, entropy, length = _batch()
    spec = filter_section("top_k_abs", 1, metric=metric, largest=largest)
    decision = apply_filter(spec, groups, scores, entropy, length)
    assert decision.metric_value.tolist() == pytest.approx([v for v in group_values for _ in range(2)])
    assert decision.group_reward_std.tolist() == pytest.approx([math.sqrt(0.5)] * 2 + [0.0] * 2 + [math.sqrt(0.5)] * 2)
    assert decision.kept.tolist() == [g in kept_groups for g in groups.tolist()]


def test_a_metric_without_its_inputs_is_refused():
    groups, scores, _, _ = _batch()
    with pytest.raises(ValueError, match="needs the per-trajectory entropy"):
        apply_filter(filter_section(metric="entropy"), groups, scores)


def test_aliases_resolve_to_their_strategy_and_filter_as_before():
    resolved = {name: (filter_strategy(name), keeps_largest(filter_section(name))) for name in FILTER_ALIASES}
    assert resolved == {"std": ("top_k", True), "std_rev": ("top_k", False), "std_top_p": ("top_p", True)}
    assert {filter_metric(filter_section(name, metric="length")) for name in FILTER_ALIASES} == {"reward_std"}
    values = dict(enumerate([0.4, 0.1, 0.3, 0.2]))
    for name, (strategy, largest) in resolved.items():
        as_alias = select_groups(values, filter_section(name, 0.5))
        assert as_alias == select_groups(values, filter_section(strategy, 0.5, largest=largest)), name
    scores = torch.tensor([0.0, 0.4, 0.0, 0.1, 0.0, 0.3, 0.0, 0.2], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    # stds .4, .1, .3, .2 over sqrt(2) (total 1 / sqrt(2) = .7071); at 0.41 the target is .2899 - eps = .2799, which
    # group 0 (.2828) reaches alone; without the epsilon it would take two groups
    kept, group_std = _alias_filter("std_top_p", scores, groups, 0.41)
    assert sorted(set(groups[kept].tolist())) == [0]
    kept, _ = _alias_filter("std_top_p", scores, groups, 0.5)  # target .3536 - .01: .2828 is short, + .2121 reaches it
    assert sorted(set(groups[kept].tolist())) == [0, 2]
    assert float(group_std[2]) == pytest.approx(0.1 / math.sqrt(2))


def test_filter_inputs_estimate_entropy_from_the_behaviour_logprobs():
    table = pa.table(
        {
            "group_id": pa.array([0, 0], pa.int32()),
            "total_reward": [1.0, 0.0],
            "response_length": pa.array([2, 4], pa.int32()),
            "behavior_logprobs": pa.array([[0.0, -1.0, -3.0], [-0.5, 0.0, -0.5, -1.0, -2.0]], pa.list_(pa.float32())),
        }
    )
    groups, scores, entropy, length = filter_inputs(table, "entropy")
    assert entropy.tolist() == pytest.approx([4.0 / 2, 4.0 / 4])
    assert length.tolist() == [2.0, 4.0] and groups.tolist() == [0, 0] and scores.tolist() == [1.0, 0.0]
    assert filter_inputs(table, "reward")[2] is None  # only computed when ranked by entropy
    scripted = table.set_column(3, "behavior_logprobs", pa.array([None, None], pa.list_(pa.float32())))
    with pytest.raises(ValueError, match="scripted rows have none"):
        filter_inputs(scripted, "entropy")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.filter=top_p", "algorithm.filter_ratio=1.5"],
            r"filter_ratio=1.5: filter top_p needs a value in \(0, 1\]",
        ),
        (["algorithm.filter=min_p", "algorithm.filter_ratio=2"], r"filter min_p needs a value in \(0, 1\]"),
        (["algorithm.filter=top_p", "algorithm.filter_ratio=0"], "filter_ratio: Input should be greater than 0"),
        (["algorithm.filter=top_k_abs", "algorithm.filter_ratio=2.5"], "must be a whole number >= 1"),
        (["algorithm.filter=top_k_abs"], "filter_ratio=0.25: filter top_k_abs"),  # the preset's share is no count
        (["algorithm.filter=std", "algorithm.filter_metric=length"], "set algorithm.filter=top_k"),
        (["algorithm.filter=std_rev", "algorithm.filter_largest=true"], "already keeps the smallest std"),
        (
            ["algorithm.filter=std_top_p", "algorithm.filter_top_p_mode=softmax"],
            "for softmax set algorithm.filter=top_p",
        ),
        (["algorithm.filter=top_k", "algorithm.filter_top_p_mode=softmax"], "only applies to algorithm.filter=top_p"),
        (["algorithm.filter=median"], "'median' is not a filter; use one of min_p, std"),
        (["algorithm.filter_metric=variance"], "algorithm.filter_metric: Input should be"),
        (["algorithm.filter_eps=-0.1"], "algorithm.filter_eps"),
        (
            ["algorithm.filter=top_k", "algorithm.filter_metric=entropy", "rollout.backend=scripted"],
            "needs behaviour log-probs",
        ),
    ],
)
def test_bad_filter_combinations_are_refused_at_load_time(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(overrides=overrides)


def test_the_filter_of_a_config():
    algorithm = build_config(
        overrides=[
            "algorithm.filter=top_p",
            "algorithm.filter_top_p_mode=softmax",
            "algorithm.filter_ratio=0.9",
            "algorithm.filter_largest=false",
            "algorithm.filter_include_zero=false",
            "algorithm.filter_metric=reward",
        ]
    ).algorithm
    resolved = (filter_strategy(algorithm.filter), algorithm.filter_ratio, filter_metric(algorithm))
    assert resolved + (keeps_largest(algorithm), algorithm.filter_include_zero, algorithm.filter_top_p_mode) == (
        "top_p",
        0.9,
        "reward",
        False,
        False,
        "softmax",
    )
    assert keeps_largest(build_config(overrides=["algorithm.filter=std_rev"]).algorithm) is False
    counted = build_config(overrides=["algorithm.filter=top_k_abs", "algorithm.filter_ratio=3"]).algorithm
    assert (filter_strategy(counted.filter), counted.filter_ratio, keeps_largest(counted)) == ("top_k_abs", 3.0, True)
