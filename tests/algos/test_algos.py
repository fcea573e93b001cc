import math

import pytest
import torch

from ragen_core.algos import (
    aggregate_loss,
    apply_filter,
    groups_to_keep,
    grpo_advantage,
    ppo_clip_loss,
    select_groups,
)
from tests.algos.filter_config import filter_section


def _alias_filter(name, scores, groups, ratio):
    """``algorithm.filter=name`` at ``ratio`` through the filter registry: (kept, group reward std) per row."""
    decision = apply_filter(filter_section(name, ratio), groups, scores)
    return decision.kept, decision.group_reward_std


def _grpo_loop(scores, groups, norm_by_std, eps=1e-6):
    """Independent loop twin of GRPO (statistics module, sample std)."""
    import statistics

    out = []
    for score, group in zip(scores, groups, strict=False):
        members = [s for s, g in zip(scores, groups, strict=False) if g == group]
        if len(members) == 1:
            out.append(score)
            continue
        mean = statistics.fmean(members)
        value = score - mean
        if norm_by_std:
            value /= statistics.stdev(members) + eps
        out.append(value)
    return out


def test_grpo_hand_computed():
    # group 0: scores 1, 0 -> mean 0.5, sample std 0.7071 -> +-0.7071; group 1: 0.1, 0.1, 0.4 -> mean 0.2
    scores = torch.tensor([1.0, 0.0, 0.1, 0.1, 0.4])
    groups = torch.tensor([0, 0, 1, 1, 1])
    rewards = torch.zeros(5, 3)
    rewards[:, -1] = scores
    mask = torch.ones(5, 3)
    adv, _ = grpo_advantage(rewards, mask, groups, norm_adv_by_std=False)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, -0.1, -0.1, 0.2])
    adv, _ = grpo_advantage(rewards, mask, groups, norm_adv_by_std=True)
    std1 = math.sqrt(((0.1 - 0.2) ** 2 * 2 + 0.2**2) / 2)
    assert adv[:, 2].tolist() == pytest.approx(
        [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), -0.1 / std1, -0.1 / std1, 0.2 / std1], rel=1e-5
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop_twin(seed, norm):
    generator = torch.Generator().manual_seed(seed)
    groups = torch.randint(0, 4, (24,), generator=generator)
    scores = torch.randn(24, generator=generator, dtype=torch.float64)
    rewards = torch.zeros(24, 5, dtype=torch.float64)
    rewards[:, 2] = scores
    mask = (torch.rand(24, 5, generator=generator) > 0.3).double()
    adv, _ = grpo_advantage(rewards, mask, groups, norm_adv_by_std=norm)
    expected = torch.tensor(_grpo_loop(scores.tolist(), groups.tolist(), norm), dtype=torch.float64)
    torch.testing.assert_close(adv, expected[:, None] * mask)


def test_ppo_clip_loss_hand_computed():
    # ratios e^{lp-old}: 1.5 (adv +1, clipped at 1.28), 0.5 (adv -1, clipped at 0.8), 1.1 (adv +2, unclipped)
    old = torch.zeros(1, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    loss, stats = ppo_clip_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # per token: max(-A r, -A clip(r)): [-1.28, 0.8, -2.2] -> mean
    assert float(loss) == pytest.approx((-1.28 + 0.8 - 2.2) / 3, rel=1e-6)
    assert float(stats["clipfrac_upper"]) == pytest.approx(1 / 3)
    assert float(stats["clipfrac_lower"]) == pytest.approx(1 / 3)
    symmetric, _ = ppo_clip_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert float(symmetric) == pytest.approx((-1.2 + 0.8 - 2.2) / 3, rel=1e-6)


def test_pessimistic_side_is_never_clipped():
    # adv > 0 and ratio < 1 - clip: the unclipped (smaller) objective is kept, so the gradient still flows
    logprobs = torch.log(torch.tensor([[0.5]])).requires_grad_(True)
    loss, _ = ppo_clip_loss(logprobs, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    assert float(loss.detach()) == pytest.approx(-0.5)
    loss.backward()
    assert float(logprobs.grad) == pytest.approx(-0.5)


def test_aggregation_modes():
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate_loss(losses, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate_loss(losses, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate_loss(losses, mask, "token-mean", token_count=8)) == pytest.approx(10 / 8)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate_loss(losses, mask, "sum")


def test_std_filter_keeps_exactly_the_top_groups():
    # 8 groups of 2: group g has scores (0, g/10) -> std grows with g; keep 25% = groups 7 and 6
    scores = torch.tensor([v for g in range(8) for v in (0.0, g / 10)])
    groups = torch.tensor([g for g in range(8) for _ in range(2)])
    kept, group_std = _alias_filter("std", scores, groups, 0.25)
    assert sorted(set(groups[kept].tolist())) == [6, 7]
    assert group_std[groups == 7][0] == pytest.approx(math.sqrt(2 * 0.35**2))
    kept_rev, _ = _alias_filter("std_rev", scores, groups, 0.25)
    assert sorted(set(groups[kept_rev].tolist())) == [0, 1]
    kept_all, _ = _alias_filter("std", scores, groups, 1.0)
    assert bool(kept_all.all())


def test_groups_to_keep_rule():
    assert groups_to_keep(0.25, 8) == 2
    assert groups_to_keep(0.5, 8) == 4
    assert groups_to_keep(0.01, 8) == 1
    assert groups_to_keep(1.0, 8) == 8


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ValueError, match="registered: min_p, top_k, top_k_abs, top_p"):
        select_groups({0: 1.0}, filter_section("median"))
