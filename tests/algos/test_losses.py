import math

import pytest
import torch

from ragen_core.algos import (
    POLICY_LOSSES,
    aggregate_loss,
    apply_kl_penalty,
    dual_clip_loss,
    kl_penalty,
    ppo_clip_loss,
    value_loss,
)
from tests.algos.loop_twins import ppo_token_loss

LN2 = math.log(2.0)


def _random_tokens(seed: int, batch: int = 8, width: int = 7):
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, width, generator=generator) > 0.3).double()
    a = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    b = a + 0.8 * torch.randn(batch, width, generator=generator, dtype=torch.float64)
    c = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    return a, b, c, mask


def _masked_loop_mean(matrix: list[list[float]], mask: list[list[float]]) -> float:
    entries = [x for row, m_row in zip(matrix, mask, strict=True) for x, m in zip(row, m_row, strict=True) if m > 0]
    return sum(entries) / len(entries)


def test_dual_clip_hand_computed():
    # ratios 1.5, 0.5, 4, 4 with advantages 1, -1, -1, 2 (clip 0.2 / 0.28, c = 3):
    # per token max(-A r, -A clip(r)): -1.28, 0.8, 4 -> dual-clipped to min(4, 3) = 3, -2.56
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 4.0, 4.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    mask = torch.ones(1, 4)
    loss, stats = dual_clip_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    assert float(loss) == pytest.approx((-1.28 + 0.8 + 3.0 - 2.56) / 4, rel=1e-6)
    assert float(stats["clipfrac_dual"]) == pytest.approx(0.25)
    assert float(stats["clipfrac_upper"]) == pytest.approx(0.5)
    assert float(stats["clipfrac_lower"]) == pytest.approx(0.25)
    plain, plain_stats = ppo_clip_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert float(plain) == pytest.approx((-1.28 + 0.8 + 4.0 - 2.56) / 4, rel=1e-6)
    assert float(plain_stats["clipfrac_dual"]) == 0.0
    assert POLICY_LOSSES.get("dual_clip") is dual_clip_loss
    with pytest.raises(ValueError, match="clip_ratio_c"):
        dual_clip_loss(logprobs, old, adv, mask, clip_ratio_c=1.0)


def test_dual_clip_stops_the_gradient_beyond_c():
    logprobs = torch.log(torch.tensor([[4.0]])).requires_grad_(True)
    loss, _ = dual_clip_loss(logprobs, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(3.0)
    assert float(logprobs.grad) == 0.0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_ppo_losses_match_loop_twin(seed, clip_c):
    old, logprobs, adv, mask = _random_tokens(seed)
    loss, _ = ppo_clip_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=clip_c)
    ratios = (logprobs - old).exp().tolist()
    per_token = [
        [ppo_token_loss(r, a, 0.2, 0.28, clip_c) for r, a in zip(r_row, a_row, strict=True)]
        for r_row, a_row in zip(ratios, adv.tolist(), strict=True)
    ]
    assert float(loss) == pytest.approx(_masked_loop_mean(per_token, mask.tolist()), rel=1e-10)


def test_value_loss_hand_computed():
    # token 0: V 1.5, old 1.0, clip 0.2 -> V_clip 1.2; max((1.5-2)^2, (1.2-2)^2) = 0.64 (clipped side wins)
    # token 1: V = old = 0, G 1 -> both 1 (not counted as clipped); loss = 0.5 * (0.64 + 1) / 2 = 0.41
    values = torch.tensor([[1.5, 0.0, 7.0]], requires_grad=True)
    old = torch.tensor([[1.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert float(loss.detach()) == pytest.approx(0.41)
    assert float(stats["vf_clipfrac"]) == pytest.approx(0.5)
    assert float(stats["vpred_mean"]) == pytest.approx(0.75)
    loss.backward()
    # clipped token: no gradient; token 1: d/dV 0.5 * (V - 1)^2 / 2 = -0.5; masked token: none
    assert values.grad[0].tolist() == pytest.approx([0.0, -0.5, 0.0])


def test_value_clip_fraction_ignores_rounding_inside_the_range():
    # float32: 0.3 + (0.1 - 0.3) = 0.099999994, one ulp below 0.1, so (V_clip - G)^2 exceeds (V - G)^2 by rounding
    # alone; |V - old| = 0.2 is inside the 0.5 range: the clip does not act, the token is not counted
    values, old, returns = torch.tensor([[0.1, 2.0]]), torch.tensor([[0.3, 0.0]]), torch.tensor([[1.0, 3.0]])
    assert float((old + (values - old))[0, 0]) != float(values[0, 0])  # the rounding this test is about
    _, stats = value_loss(values, old, returns, torch.ones(1, 2), cliprange_value=0.5)
    assert float(stats["vf_clipfrac"]) == 0.5  # token 1 only: V 2.0 clipped to 0.5, (0.5 - 3)^2 > (2 - 3)^2


@pytest.mark.parametrize("seed", range(5))
def test_value_loss_matches_loop_twin(seed):
    old, values, returns, mask = _random_tokens(seed)
    loss, stats = value_loss(values, old, returns, mask, cliprange_value=0.5, loss_agg_mode="seq-mean-token-sum")
    per_sequence, clipped = [], []
    for v_row, o_row, g_row, m_row in zip(values.tolist(), old.tolist(), returns.tolist(), mask.tolist(), strict=True):
        total = 0.0
        for v, o, g, m in zip(v_row, o_row, g_row, m_row, strict=True):
            if m > 0:
                v_clip = min(max(v, o - 0.5), o + 0.5)
                total += max((v - g) ** 2, (v_clip - g) ** 2)
                clipped.append(float((v_clip - g) ** 2 > (v - g) ** 2))
        per_sequence.append(total)
    assert float(loss) == pytest.approx(0.5 * sum(per_sequence) / len(per_sequence), rel=1e-10)
    assert float(stats["vf_clipfrac"]) == pytest.approx(sum(clipped) / len(clipped))


@pytest.mark.parametrize(
    ("kind", "forward", "backward"),
    [
        ("k1", LN2, -LN2),
        ("kl", LN2, -LN2),
        ("abs", LN2, LN2),
        ("k2", 0.5 * LN2**2, 0.5 * LN2**2),
        ("mse", 0.5 * LN2**2, 0.5 * LN2**2),
        ("k3", 0.5 - 1.0 + LN2, 2.0 - 1.0 - LN2),  # 1/r - 1 + log r with r = 2 and r = 1/2
        ("low_var_kl", 0.5 - 1.0 + LN2, 2.0 - 1.0 - LN2),
    ],
)
def test_kl_estimators_hand_computed(kind, forward, backward):
    half, quarter = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert float(kl_penalty(half, quarter, kind)) == pytest.approx(forward, rel=1e-6)
    assert float(kl_penalty(quarter, half, kind)) == pytest.approx(backward, rel=1e-6)


def test_low_var_kl_is_clamped_and_unknown_estimator_raises():
    assert float(kl_penalty(torch.tensor([0.0]), torch.tensor([50.0]), "k3")) == 10.0
    with pytest.raises(ValueError, match="KL estimator"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_apply_kl_penalty_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    ref = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    new_rewards, mean_kl = apply_kl_penalty(rewards, logprobs, ref, mask, kl_coef=0.1, kind="k1")
    torch.testing.assert_close(new_rewards, torch.tensor([[-0.01, -0.02, 0.97], [-0.04, 0.95, 0.0]]))
    assert float(mean_kl) == pytest.approx((0.2 + 0.45) / 2)  # per-sequence token means, then their mean


@pytest.mark.parametrize("seed", range(5))
def test_apply_kl_penalty_matches_loop_twin(seed):
    ref, logprobs, rewards, mask = _random_tokens(seed)
    new_rewards, mean_kl = apply_kl_penalty(rewards, logprobs, ref, mask, kl_coef=0.05, kind="low_var_kl")
    expected, per_sequence = [], []
    for r_row, lp_row, ref_row, m_row in zip(
        rewards.tolist(), logprobs.tolist(), ref.tolist(), mask.tolist(), strict=True
    ):
        kls = [min(10.0, math.exp(q - p) - (q - p) - 1.0) * m for p, q, m in zip(lp_row, ref_row, m_row, strict=True)]
        expected.append([r - 0.05 * k for r, k in zip(r_row, kls, strict=True)])
        per_sequence.append(sum(kls) / max(sum(m_row), 1.0))
    torch.testing.assert_close(new_rewards, torch.tensor(expected, dtype=torch.float64))
    assert float(mean_kl) == pytest.approx(sum(per_sequence) / len(per_sequence), rel=1e-10)


def test_seq_mean_token_sum():
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate_loss(losses, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)


def test_sequence_means_skip_rows_without_trained_tokens():
    # the third row has no masked token: it is not a sequence of the mean (veRL's seq_mask), so it does not dilute
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert float(aggregate_loss(losses, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate_loss(losses, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(aggregate_loss(losses, torch.zeros(3, 3), "seq-mean-token-mean")) == 0.0  # nothing to train


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregation_matches_loop_twin(seed, mode):
    losses, _, _, mask = _random_tokens(seed)
    per_sequence = []
    for row, m_row in zip(losses.tolist(), mask.tolist(), strict=True):
        kept = [x for x, m in zip(row, m_row, strict=True) if m > 0]
        per_sequence.append(sum(kept) / max(len(kept), 1) if mode == "seq-mean-token-mean" else sum(kept))
    if mode == "token-mean":
        expected = sum(per_sequence) / float(mask.sum())
    else:  # the mean over the sequences that have a masked token
        trained = [p for p, m_row in zip(per_sequence, mask.tolist(), strict=True) if sum(m_row) > 0]
        expected = sum(trained) / max(len(trained), 1)
    assert float(aggregate_loss(losses, mask, mode)) == pytest.approx(expected, rel=1e-10)
