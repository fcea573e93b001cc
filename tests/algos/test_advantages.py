import math
from types import SimpleNamespace

import pytest
import torch

from ragen_core.algos import (
    ADVANTAGES,
    POLICY_LOSSES,
    STRATEGIES,
    bi_level_gae_advantage,
    critic_free_estimators,
    gae_advantage,
    grpo_advantage,
    needs_critic,
    place_turn_rewards,
    ppo_clip_loss,
    reinforce_plus_plus_advantage,
    reinforce_plus_plus_baseline_advantage,
    rloo_advantage,
)
from ragen_core.config import AlgorithmConfig, build_config
from tests.algos.loop_twins import (
    bi_level_gae_row,
    gae_row,
    group_baseline,
    ppo_token_loss,
    returns_to_go_row,
    whiten,
)

# One row: prompt token, a two-token turn, one env token, a one-token turn (per-turn rewards 0.1 and 1.0).
MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
VALUES = torch.tensor([[9.0, 0.5, 0.4, 9.0, 0.2]])
REWARDS = torch.tensor([[0.0, 0.0, 0.1, 0.0, 1.0]])
ONE_GROUP = torch.tensor([0])


def _close(actual: torch.Tensor, expected, rel: float = 1e-5) -> None:
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), rtol=rel, atol=1e-6)


def _random_batch(seed: int, batch: int = 12, width: int = 9):
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, width, generator=generator) > 0.35).double()  # many turns, env gaps, empty rows
    rewards = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    values = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    groups = torch.randint(0, 4, (batch,), generator=generator)
    return rewards, values, mask, groups


def _single_turn_batch(seed: int, batch: int = 6, width: int = 10):
    """Prompt, one response run of random length, padding; the score on the last response token."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, width, dtype=torch.float64)
    for row in range(batch):
        start = int(torch.randint(1, 4, (1,), generator=generator))
        end = int(torch.randint(start + 1, width + 1, (1,), generator=generator))
        mask[row, start:end] = 1.0
    scores = torch.randn(batch, generator=generator, dtype=torch.float64)
    rewards = place_turn_rewards(mask, [[float(s)] for s in scores]).double()
    values = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    return rewards, values, mask


def test_gae_hand_computed_skips_env_tokens():
    # Masked tokens 1, 2, 4 (gamma 0.9, lam 0.8): delta_4 = 1 - 0.2 = 0.8, A_4 = 0.8;
    # delta_2 = 0.1 + 0.9 * 0.2 - 0.4 = -0.12, A_2 = -0.12 + 0.72 * 0.8 = 0.456 (token 3 does not discount);
    # delta_1 = 0.9 * 0.4 - 0.5 = -0.14, A_1 = -0.14 + 0.72 * 0.456 = 0.18832.
    adv, ret = gae_advantage(REWARDS, MASK, ONE_GROUP, values=VALUES, gamma=0.9, lam=0.8, whiten_advantages=False)
    assert adv[0].tolist() == pytest.approx([0.0, 0.18832, 0.456, 0.0, 0.8])
    assert ret[0].tolist() == pytest.approx([0.0, 0.68832, 0.856, 0.0, 1.0])


def test_bi_level_gae_hand_computed():
    # Turns [1, 2] (R 0.1, V_e 0.4) and [4] (R 1.0, V_e 0.2); high gamma 0.5, gamma 0.9, lam 0.8.
    # High level: Â_1 = 1.0 - 0.2 = 0.8; Â_0 = 0.1 + 0.5 * 0.2 - 0.4 + 0.5 * 0.8 * 0.8 = 0.12.
    # Low level in turn 0: A_2 = Â_0 = 0.12; A_1 = 0.9 * 0.4 - 0.5 + 0.72 * 0.12 = -0.0536.
    adv, ret = bi_level_gae_advantage(
        REWARDS, MASK, ONE_GROUP, values=VALUES, gamma=0.9, lam=0.8, high_level_gamma=0.5, whiten_advantages=False
    )
    assert adv[0].tolist() == pytest.approx([0.0, -0.0536, 0.12, 0.0, 0.8])
    assert ret[0].tolist() == pytest.approx([0.0, 0.4464, 0.52, 0.0, 1.0])


def test_gae_whitens_over_the_masked_tokens():
    adv, _ = gae_advantage(REWARDS, MASK, ONE_GROUP, values=VALUES, gamma=0.9, lam=0.8)
    raw = [0.18832, 0.456, 0.8]
    mean, std = sum(raw) / 3, math.sqrt(sum((x - sum(raw) / 3) ** 2 for x in raw) / 2)
    _close(adv[0], [0.0] + [(x - mean) / std for x in raw[:2]] + [0.0, (0.8 - mean) / std])


@pytest.mark.parametrize("name", ["gae", "bi_level_gae"])
def test_critic_estimators_need_values(name):
    with pytest.raises(ValueError, match="needs critic values"):
        ADVANTAGES.get(name)(REWARDS, MASK, ONE_GROUP)


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_loop_twin(seed):
    rewards, values, mask, groups = _random_batch(seed)
    adv, ret = gae_advantage(rewards, mask, groups, values=values, gamma=0.97, lam=0.9, whiten_advantages=False)
    rows = [
        gae_row(r, v, m, 0.97, 0.9) for r, v, m in zip(rewards.tolist(), values.tolist(), mask.tolist(), strict=True)
    ]
    torch.testing.assert_close(adv, torch.tensor([a for a, _ in rows], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([g for _, g in rows], dtype=torch.float64))
    whitened, _ = gae_advantage(rewards, mask, groups, values=values, gamma=0.97, lam=0.9)
    expected = whiten([a for a, _ in rows], mask.tolist())
    torch.testing.assert_close(whitened, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("seed", range(5))
def test_bi_level_gae_matches_loop_twin(seed):
    rewards, values, mask, groups = _random_batch(seed)
    adv, ret = bi_level_gae_advantage(
        rewards, mask, groups, values=values, gamma=0.97, lam=0.9, high_level_gamma=0.8, whiten_advantages=False
    )
    rows = [
        bi_level_gae_row(r, v, m, 0.97, 0.9, 0.8)
        for r, v, m in zip(rewards.tolist(), values.tolist(), mask.tolist(), strict=True)
    ]
    torch.testing.assert_close(adv, torch.tensor([a for a, _ in rows], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([g for _, g in rows], dtype=torch.float64))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gammas", [(1.0, 1.0, 1.0), (0.9, 0.95, 0.7)])
def test_bi_level_gae_equals_gae_on_single_turn_batches(seed, gammas):
    gamma, lam, high_level_gamma = gammas
    rewards, values, mask = _single_turn_batch(seed)
    groups = torch.zeros(len(mask), dtype=torch.long)
    bi_level = bi_level_gae_advantage(
        rewards, mask, groups, values=values, gamma=gamma, lam=lam, high_level_gamma=high_level_gamma
    )
    plain = gae_advantage(rewards, mask, groups, values=values, gamma=gamma, lam=lam)
    torch.testing.assert_close(bi_level, plain)


@pytest.mark.parametrize("seed", range(4))
def test_starpo_token_loss_on_single_turn_batch_equals_plain_ppo(seed):
    """Multi-turn StarPO path (per-turn reward placement, bi-level GAE over the whole chat sequence, masked PPO
    loss) on a single-turn batch vs PPO written over each response alone (cleanrl style, lists)."""
    rewards, values, mask = _single_turn_batch(seed)
    generator = torch.Generator().manual_seed(100 + seed)
    old_logprobs = -torch.rand(mask.shape, generator=generator, dtype=torch.float64)
    logprobs = old_logprobs + 0.4 * torch.randn(mask.shape, generator=generator, dtype=torch.float64)
    groups = torch.zeros(len(mask), dtype=torch.long)
    adv, _ = bi_level_gae_advantage(rewards, mask, groups, values=values, gamma=1.0, lam=1.0, high_level_gamma=1.0)
    starpo, _ = ppo_clip_loss(logprobs, old_logprobs, adv, mask, clip_low=0.2, clip_high=0.28)

    responses = []  # (score, values, ratios) of each response on its own
    for row in range(len(mask)):
        positions = [t for t in range(mask.shape[1]) if mask[row, t] > 0]
        ratios = [math.exp(float(logprobs[row, t] - old_logprobs[row, t])) for t in positions]
        responses.append((float(rewards[row].sum()), [float(values[row, t]) for t in positions], ratios))
    # gamma = lam = 1 with the score at the end: A_t = score - V_t, then whitening over all response tokens
    raw = [[score - v for v in vals] for score, vals, _ in responses]
    whitened = whiten(raw, [[1.0] * len(r) for r in raw])
    token_losses = [
        ppo_token_loss(ratio, a, 0.2, 0.28, None)
        for (_, _, ratios), advs in zip(responses, whitened, strict=True)
        for ratio, a in zip(ratios, advs, strict=True)
    ]
    assert float(starpo) == pytest.approx(sum(token_losses) / len(token_losses), rel=1e-9)


def test_grpo_groups_by_batch():
    # scores 1, 0, 0.5, 0.5 in two groups; batch grouping: mean 0.5, sample std sqrt(0.5 / 3)
    rewards = torch.tensor([[1.0], [0.0], [0.5], [0.5]])
    mask = torch.ones(4, 1)
    groups = torch.tensor([0, 0, 1, 1])
    adv, _ = grpo_advantage(rewards, mask, groups, grouping="batch", epsilon=0.0)
    std = math.sqrt(0.5 / 3)
    assert adv[:, 0].tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0])
    by_state, _ = grpo_advantage(rewards, mask, groups, grouping="state", norm_adv_by_std=False)
    assert by_state[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="grouping"):
        grpo_advantage(rewards, mask, groups, grouping="trajectory")


@pytest.mark.parametrize("seed", range(5))
def test_grpo_batch_grouping_matches_loop_twin(seed):
    rewards, _, mask, groups = _random_batch(seed)
    adv, _ = grpo_advantage(rewards, mask, groups, grouping="batch", epsilon=0.0)
    scores = rewards.sum(-1).tolist()
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
    torch.testing.assert_close(adv, torch.tensor([(s - mean) / std for s in scores])[:, None].double() * mask)


def test_rloo_hand_computed():
    # group 0: 1, 0, 0.5 -> 1 - 0.25, 0 - 0.75, 0.5 - 0.5; group 7 has one member and keeps its score
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 0.3]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    adv, ret = rloo_advantage(rewards, mask, torch.tensor([0, 0, 0, 7]))
    _close(adv, [[0.75, 0.75], [-0.75, -0.75], [0.0, 0.0], [0.3, 0.3]])
    torch.testing.assert_close(ret, adv)


@pytest.mark.parametrize("seed", range(5))
def test_rloo_matches_loop_twin(seed):
    rewards, _, mask, groups = _random_batch(seed)
    adv, _ = rloo_advantage(rewards, mask, groups)
    scores = rewards.sum(-1).tolist()
    baseline = group_baseline(scores, groups.tolist(), leave_one_out=True)
    expected = torch.tensor([s - b for s, b in zip(scores, baseline, strict=True)], dtype=torch.float64)
    torch.testing.assert_close(adv, expected[:, None] * mask)


def test_reinforce_plus_plus_hand_computed():
    # gamma 0.5. Row 0: tokens 0 and 2 (env token 1 skipped): G_2 = 1, G_0 = 0.2 + 0.5 * 1 = 0.7.
    # Row 1: tokens 0 and 1: G_1 = -1, G_0 = 0 + 0.5 * -1 = -0.5. Masked G: 0.7, 1, -0.5, -1 (mean 0.05, var 0.91).
    rewards = torch.tensor([[0.2, 5.0, 1.0], [0.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = reinforce_plus_plus_advantage(rewards, mask, torch.tensor([0, 0]), gamma=0.5)
    _close(ret, [[0.7, 0.0, 1.0], [-0.5, -1.0, 0.0]])
    std = math.sqrt(0.91)
    _close(adv, [[0.65 / std, 0.0, 0.95 / std], [-0.55 / std, -1.05 / std, 0.0]])


def test_reinforce_plus_plus_baseline_hand_computed():
    # scores 1, 0 (group 0, mean 0.5) and 0.4 (alone, mean 0): centred 0.5, -0.5, 0.4 on tokens (2, 1, 1 tokens)
    # masked entries 0.5, 0.5, -0.5, 0.4: mean 0.225, sample var 0.7075 / 3
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.4]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    adv, _ = reinforce_plus_plus_baseline_advantage(rewards, mask, torch.tensor([0, 0, 1]))
    std = math.sqrt(0.7075 / 3)
    expected = [[0.275 / std, 0.275 / std], [-0.725 / std, 0.0], [0.0, 0.175 / std]]
    _close(adv, expected)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_plus_plus_matches_loop_twin(seed):
    rewards, _, mask, groups = _random_batch(seed)
    adv, ret = reinforce_plus_plus_advantage(rewards, mask, groups, gamma=0.9)
    returns = [returns_to_go_row(r, m, 0.9) for r, m in zip(rewards.tolist(), mask.tolist(), strict=True)]
    torch.testing.assert_close(ret, torch.tensor(returns, dtype=torch.float64))
    torch.testing.assert_close(adv, torch.tensor(whiten(returns, mask.tolist()), dtype=torch.float64))


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_plus_plus_baseline_matches_loop_twin(seed):
    rewards, _, mask, groups = _random_batch(seed)
    adv, _ = reinforce_plus_plus_baseline_advantage(rewards, mask, groups)
    scores = rewards.sum(-1).tolist()
    baseline = group_baseline(scores, groups.tolist(), leave_one_out=False)
    centred = [[s - b] * mask.shape[1] for s, b in zip(scores, baseline, strict=True)]
    torch.testing.assert_close(adv, torch.tensor(whiten(centred, mask.tolist()), dtype=torch.float64))


def test_the_registry_passes_each_estimator_its_own_options():
    algorithm = build_config().algorithm
    for name in ADVANTAGES.names():
        adv, ret = ADVANTAGES.call(name, algorithm, REWARDS, MASK, ONE_GROUP, values=VALUES.clone())
        assert adv.shape == ret.shape == MASK.shape
        assert bool((adv[MASK == 0] == 0).all())
    assert ADVANTAGES.options("grpo") == {"norm_adv_by_std": "norm_adv_by_std", "grouping": "grpo_grouping"}
    assert ADVANTAGES.options("rloo") == {}
    # gae reads its own fields of the section, and no other: grpo's grouping set to a value gae would choke on
    direct, _ = gae_advantage(REWARDS, MASK, ONE_GROUP, values=VALUES, gamma=0.9, lam=0.8)
    section = SimpleNamespace(gamma=0.9, lam=0.8, whiten_advantages=True, grpo_grouping="x")
    routed, _ = ADVANTAGES.call("gae", section, REWARDS, MASK, ONE_GROUP, values=VALUES)
    torch.testing.assert_close(routed, direct)


def test_an_estimator_that_takes_values_needs_a_critic():
    configs = {name: build_config(overrides=[f"algorithm.adv_estimator={name}"]) for name in ADVANTAGES.names()}
    critics = {name for name, config in configs.items() if needs_critic(config.algorithm.adv_estimator)}
    assert critics == {"gae", "bi_level_gae"}


def test_the_estimators_without_a_critic_are_derived_from_the_registry():
    """The one list of critic-free estimators (an error's advice, offline pg's refusal) follows the registry: a newly
    registered estimator joins it unless it takes ``values=``."""
    assert critic_free_estimators() == ["grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"]

    def free(token_rewards, response_mask, group_index):
        return token_rewards, token_rewards

    def critic(token_rewards, response_mask, group_index, values=None):
        return token_rewards, token_rewards

    ADVANTAGES.add("planted_free", free)
    ADVANTAGES.add("planted_critic", critic)
    try:
        assert critic_free_estimators() == [
            "grpo",
            "planted_free",
            "reinforce_plus_plus",
            "reinforce_plus_plus_baseline",
            "rloo",
        ]
        with pytest.raises(ValueError, match=r"without a critic \(grpo, planted_free, reinforce_plus_plus, "):
            gae_advantage(REWARDS, MASK, ONE_GROUP)
    finally:
        ADVANTAGES.remove("planted_free")
        ADVANTAGES.remove("planted_critic")


def test_every_declared_option_is_an_algorithm_field():
    fields = set(AlgorithmConfig.model_fields)
    for registry in (ADVANTAGES, POLICY_LOSSES, STRATEGIES):
        for name in registry.names():
            assert set(registry.options(name).values()) <= fields, (registry.kind, name)


def test_a_misspelt_option_is_refused():
    with pytest.raises(TypeError, match="norm_adv_by_sd"):
        grpo_advantage(REWARDS, MASK, ONE_GROUP, norm_adv_by_sd=False)
    with pytest.raises(TypeError, match="values"):
        rloo_advantage(REWARDS, MASK, ONE_GROUP, values=VALUES)  # rloo needs no critic and says so
    with pytest.raises(TypeError, match=r"unknown advantage estimator keyword\(s\) valeus; known: "):
        ADVANTAGES.call("gae", build_config().algorithm, REWARDS, MASK, ONE_GROUP, valeus=VALUES)
