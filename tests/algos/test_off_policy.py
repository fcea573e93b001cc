"""The off-policy correction (algorithm.off_policy_correction): importance weights proximal / behaviour, truncated
(tis) or masked out above the cap (decoupled), applied as a per-token scaling of the advantages."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from pydantic import ValidationError

from ragen_core.algos import behaviour_weights, dual_clip_loss, ppo_clip_loss
from ragen_core.config import RunConfig, build_config
from ragen_core.training import ActorEngine, OptimConfig, collate
from ragen_core.training.starpo import reuses_behavior_logprobs, starpo_update, uses_stored_logprobs
from ragen_core.update.inputs import UpdateInputs

LN2, LN3 = math.log(2.0), math.log(3.0)


def _three_tokens():
    """Proximal log-probs ln 0.5, 0, ln 3 over behaviour 0: raw weights 0.5, 1, 3. A fourth token off the mask has
    raw weight e^5 ~ 148 and a second row has no masked token at all."""
    proximal = torch.tensor([[-LN2, 0.0, LN3, 5.0], [4.0, -4.0, 0.0, 0.0]])
    behaviour = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return proximal, behaviour, mask


# behaviour_kl = mean(behaviour - proximal) = -(ln 0.5 + 0 + ln 3) / 3 = -ln(1.5) / 3
BEHAVIOUR_KL = -math.log(1.5) / 3


def test_tis_truncates_at_the_cap():
    proximal, behaviour, mask = _three_tokens()
    weights, stats = behaviour_weights(proximal, behaviour, mask, "tis", 2.0)
    # 0.5, 1, 3 -> min(., 2) = 0.5, 1, 2; 0 off the mask (the e^5 token and the empty row)
    expected = torch.tensor([[0.5, 1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(weights, expected)
    assert weights.dtype == torch.float32 and not weights.requires_grad
    assert stats["actor/is_weight_mean"] == pytest.approx(3.5 / 3)  # (0.5 + 1 + 2) / 3
    assert stats["actor/is_weight_max"] == pytest.approx(2.0)
    assert stats["actor/is_capped_share"] == pytest.approx(1 / 3)  # the weight 3 of 3 masked tokens
    assert stats["actor/behaviour_kl"] == pytest.approx(BEHAVIOUR_KL)
    # no cap: 2.0
    unset, unset_stats = behaviour_weights(proximal, behaviour, mask, "tis", None)
    assert torch.equal(unset, weights) and unset_stats == stats


def test_decoupled_leaves_out_tokens_above_the_cap_and_keeps_all_without_one():
    proximal, behaviour, mask = _three_tokens()
    uncapped, stats = behaviour_weights(proximal, behaviour, mask, "decoupled", None)
    torch.testing.assert_close(uncapped, torch.tensor([[0.5, 1.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert stats["actor/is_weight_mean"] == pytest.approx(1.5)  # (0.5 + 1 + 3) / 3
    assert stats["actor/is_weight_max"] == pytest.approx(3.0)
    assert stats["actor/is_capped_share"] == 0.0
    assert stats["actor/behaviour_kl"] == pytest.approx(BEHAVIOUR_KL)
    capped, capped_stats = behaviour_weights(proximal, behaviour, mask, "decoupled", 2.0)
    # 3 > 2: left out (weight 0); 0.5 and 1 stay
    torch.testing.assert_close(capped, torch.tensor([[0.5, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert capped_stats["actor/is_weight_mean"] == pytest.approx(0.5)  # (0.5 + 1 + 0) / 3
    assert capped_stats["actor/is_weight_max"] == pytest.approx(1.0)
    assert capped_stats["actor/is_capped_share"] == pytest.approx(1 / 3)


def test_off_mask_tokens_weigh_nothing_and_count_in_no_statistic():
    proximal, behaviour, mask = _three_tokens()
    # the off-mask entries changed wildly (even to an infinite gap): weights and statistics do not move
    wild_proximal = proximal.clone()
    wild_proximal[0, 3], wild_proximal[1] = -30.0, torch.tensor([30.0, -30.0, 7.0, 1.0])
    wild_behaviour = behaviour.clone()
    wild_behaviour[1, 0] = -math.inf
    for mode, cap in (("tis", 2.0), ("decoupled", None), ("decoupled", 2.0), ("none", None)):
        weights, stats = behaviour_weights(proximal, behaviour, mask, mode, cap)
        wild, wild_stats = behaviour_weights(wild_proximal, wild_behaviour, mask, mode, cap)
        assert torch.equal(weights, wild) and stats == wild_stats, mode
        assert bool((weights[mask == 0] == 0).all())
    ones, none_stats = behaviour_weights(proximal, behaviour, mask, "none")
    assert torch.equal(ones, mask)
    assert none_stats["actor/is_weight_mean"] == 1.0 and none_stats["actor/is_capped_share"] == 0.0
    _, empty = behaviour_weights(proximal, behaviour, torch.zeros(2, 4), "tis")
    assert empty == {
        "actor/is_weight_mean": 0.0,
        "actor/is_weight_max": 0.0,
        "actor/is_capped_share": 0.0,
        "actor/behaviour_kl": 0.0,
    }
    with pytest.raises(ValueError, match="unknown off_policy_correction"):
        behaviour_weights(proximal, behaviour, mask, "is")


def test_weighted_advantages_give_the_weighted_token_losses_by_hand():
    # ratios r = 1.5, 0.5, 4, 1 against the proximal policy, advantages 1, -1, -1, 2, weights 2, 0.5, 0.25, 0
    # (clip 0.2 / 0.28, c = 3); per token w * max(-A r, -A clip(r)):
    #   2 * max(-1.5, -1.28) = -2.56;  0.5 * max(0.5, 0.8) = 0.4;  0.25 * max(4, 1.28) = 1;  0 * (...) = 0
    #   dual clip on A < 0: the third token is 0.25 * min(4, 3) = 0.75
    # token mean over the 4 masked tokens (the weight-0 token counts in the denominator):
    #   ppo (-2.56 + 0.4 + 1 + 0) / 4 = -0.29;  dual (-2.56 + 0.4 + 0.75 + 0) / 4 = -0.3525
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 4.0, 1.0]], dtype=torch.float64))
    proximal = torch.zeros(1, 4, dtype=torch.float64)
    advantages = torch.tensor([[1.0, -1.0, -1.0, 2.0]], dtype=torch.float64)
    weights = torch.tensor([[2.0, 0.5, 0.25, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    ppo, _ = ppo_clip_loss(logprobs, proximal, advantages * weights, mask, 0.2, 0.28)
    dual, stats = dual_clip_loss(logprobs, proximal, advantages * weights, mask, 0.2, 0.28, clip_ratio_c=3.0)
    assert float(ppo) == pytest.approx(-0.29)
    assert float(dual) == pytest.approx(-0.3525)
    assert float(stats["clipfrac_dual"]) == pytest.approx(0.25)  # the third token only


def test_weighted_advantages_equal_the_weighted_loss_on_random_tokens():
    """The identity behind the implementation, over random tokens: the loss with advantages w A equals the per-token
    w * (PPO loss with A), written out one token at a time, token-mean over every masked token."""
    generator = torch.Generator().manual_seed(5)
    shape = (6, 9)
    mask = (torch.rand(shape, generator=generator) > 0.3).double()
    proximal = torch.randn(shape, generator=generator, dtype=torch.float64)
    logprobs = proximal + 0.6 * torch.randn(shape, generator=generator, dtype=torch.float64)
    behaviour = proximal + 0.8 * torch.randn(shape, generator=generator, dtype=torch.float64)
    advantages = torch.randn(shape, generator=generator, dtype=torch.float64)
    for mode, cap in (("tis", 1.5), ("decoupled", 1.5), ("decoupled", None)):
        weights, _ = behaviour_weights(proximal, behaviour, mask, mode, cap)
        for c in (None, 3.0):
            total, count = 0.0, 0
            for b in range(shape[0]):
                for t in range(shape[1]):
                    if mask[b, t] == 0:
                        continue
                    r = math.exp(float(logprobs[b, t] - proximal[b, t]))
                    a, w = float(advantages[b, t]), float(weights[b, t])
                    token = max(-a * r, -a * min(max(r, 0.8), 1.28))
                    if c is not None and a < 0:
                        token = min(token, -a * c)
                    total, count = total + w * token, count + 1
            loss, _ = ppo_clip_loss(logprobs, proximal, advantages * weights, mask, 0.2, 0.28, clip_ratio_c=c)
            assert float(loss) == pytest.approx(total / count, rel=1e-6, abs=1e-9), (mode, cap, c)


@pytest.mark.parametrize("mode", ["decoupled", "tis"])
def test_an_unchanged_policy_gets_weight_one_and_the_synchronous_loss_bitwise(mode):
    """max_staleness 1 with a policy that has not moved: proximal == behaviour, every weight exactly 1.0, and the
    loss is the uncorrected one bit for bit."""
    generator = torch.Generator().manual_seed(2)
    mask = (torch.rand(4, 7, generator=generator) > 0.3).float()
    behaviour = torch.randn(4, 7, generator=generator) * mask
    logprobs = behaviour + 0.3 * torch.randn(4, 7, generator=generator)
    advantages = torch.randn(4, 7, generator=generator) * mask
    weights, stats = behaviour_weights(behaviour.clone(), behaviour, mask, mode, 2.0)
    assert torch.equal(weights, mask)
    assert stats["actor/is_capped_share"] == 0.0 and stats["actor/behaviour_kl"] == 0.0
    for loss_fn in (ppo_clip_loss, dual_clip_loss):
        plain, plain_stats = loss_fn(logprobs, behaviour, advantages, mask, 0.2, 0.28)
        weighted, weighted_stats = loss_fn(logprobs, behaviour, advantages * weights, mask, 0.2, 0.28)
        assert torch.equal(plain, weighted)
        assert all(torch.equal(plain_stats[key], weighted_stats[key]) for key in plain_stats)


def _inputs(behaviour: torch.Tensor | None = None) -> UpdateInputs:
    return UpdateInputs(collate([[1, 2]], [[0, 1]], 0), torch.zeros(1), torch.zeros(1), behavior_logprobs=behaviour)


def test_auto_does_not_reuse_the_samplers_logprobs_in_an_async_run():
    with_logprobs = _inputs(torch.zeros(1, 2))
    assert reuses_behavior_logprobs(RunConfig(), with_logprobs, "fp32") is True
    stale = RunConfig(trainer={"max_staleness": 1})
    assert reuses_behavior_logprobs(stale, with_logprobs, "fp32") is False
    told = RunConfig(trainer={"max_staleness": 1}, actor={"reuse_behavior_logprobs": "always"})
    assert reuses_behavior_logprobs(told, with_logprobs, "fp32") is True


def test_the_config_refuses_a_cap_without_a_correction_and_a_correction_without_stored_logprobs():
    with pytest.raises(ValidationError, match="is_cap bounds the off-policy correction"):
        RunConfig(algorithm={"is_cap": 2.0})
    with pytest.raises(ValidationError, match="scripted rollouts"):
        RunConfig(algorithm={"off_policy_correction": "tis"}, rollout={"backend": "scripted"})
    assert RunConfig(algorithm={"off_policy_correction": "decoupled", "is_cap": 5.0}).algorithm.is_cap == 5.0


def test_the_update_refuses_a_correction_without_behaviour_logprobs():
    config = build_config({}, ["algorithm.off_policy_correction=tis"])
    with pytest.raises(ValueError, match="needs the sampler's stored log-probs"):
        uses_stored_logprobs(config, _inputs(None), "fp32")  # the update's first step: before any forward


def _engine(tiny_policy) -> ActorEngine:
    model, _ = tiny_policy
    optim = OptimConfig(lr=0.5, weight_decay=0.0, grad_clip=1.0, micro_batch_size=2, optimizer="sgd")
    return ActorEngine(copy.deepcopy(model), optim)


@pytest.fixture(scope="module")
def small_batch(tiny_policy):
    """Four rows of random tokens (prompt unmasked, reply masked), two groups with scores of both signs."""
    generator = torch.Generator().manual_seed(0)
    lengths, prompt = (9, 12, 7, 11), 4
    ids = [torch.randint(5, 200, (n,), generator=generator).tolist() for n in lengths]
    masks = [[0] * prompt + [1] * (n - prompt) for n in lengths]
    batch = collate(ids, masks, tiny_policy[1].pad_token_id)
    return batch, torch.tensor([1.0, 0.0, 0.2, 0.9]), torch.tensor([0, 0, 1, 1])


def test_decoupled_with_the_policys_own_logprobs_updates_bitwise_as_no_correction(tiny_policy, small_batch):
    batch, scores, groups = small_batch
    behaviour = _engine(tiny_policy).score(batch)  # the unchanged policy's own log-probs: every weight is 1.0
    base = ["actor.mini_batch_size=4", "actor.micro_batch_size=2", "algorithm.kl_coef=0"]
    runs = {}
    for name, overrides in (
        ("none", ["actor.reuse_behavior_logprobs=never"]),
        ("decoupled", ["algorithm.off_policy_correction=decoupled"]),
        ("tis", ["algorithm.off_policy_correction=tis", "algorithm.is_cap=1.5"]),
    ):
        actor = _engine(tiny_policy)
        config = build_config({}, [*base, *overrides])
        runs[name] = (
            starpo_update(config, actor, None, UpdateInputs(batch, scores, groups, behavior_logprobs=behaviour), 0),
            actor,
        )
    plain, plain_actor = runs["none"]
    for name in ("decoupled", "tis"):
        metrics, actor = runs[name]
        assert metrics["actor/is_weight_mean"] == 1.0 and metrics["actor/is_capped_share"] == 0.0, name
        assert all(metrics[key] == value for key, value in plain.items()), name
        for a, b in zip(plain_actor.module.parameters(), actor.module.parameters(), strict=True):
            assert torch.equal(a, b), name


def test_tis_reports_the_truncation_of_a_stale_batch(tiny_policy, small_batch):
    """Behaviour log-probs ln 3 below the policy's on every trained token: raw weights 3, all truncated at 2."""
    batch, scores, groups = small_batch
    actor = _engine(tiny_policy)
    behaviour = actor.score(batch) - LN3 * batch.loss_mask
    config = build_config(
        {}, ["actor.mini_batch_size=4", "actor.micro_batch_size=2", "algorithm.off_policy_correction=tis"]
    )
    metrics = starpo_update(config, actor, None, UpdateInputs(batch, scores, groups, behavior_logprobs=behaviour), 0)
    assert metrics["actor/is_capped_share"] == 1.0
    assert metrics["actor/is_weight_mean"] == pytest.approx(2.0)
    assert metrics["actor/is_weight_max"] == pytest.approx(2.0)
    assert metrics["actor/behaviour_kl"] == pytest.approx(-LN3, rel=1e-5)
