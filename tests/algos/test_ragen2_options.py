"""RAGEN-2's filter options beyond the strategies (issue 31 item 7): the reward_sum and entropy_variance metrics
against a port of RAGEN-2's filter written here, the full-distribution entropy against a direct softmax, soft
advantage reweighting and filter loss scaling against hand-computed factors, the ragen2 preset, and the config
rules for the new keys."""

import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen_core.algos import apply_filter, filter_metric, filter_strategy, keeps_largest
from ragen_core.algos.reweighting import filter_loss_scale, soft_advantage_weights
from ragen_core.config import PRESETS, ConfigError
from ragen_core.run.batches import filter_inputs
from ragen_core.run.checks import build_run_config as build_config
from ragen_core.training.entropy import trajectory_entropy
from ragen_core.update.advantages import scaled_advantages
from ragen_core.update.inputs import UpdateInputs
from ragen_core.update.rows import TokenRows
from tests.algos.filter_config import filter_section

# ---- a port of RAGEN-2's rollout_filter.py (its _select_top_groups for top_p / top_k, and the group scores of its
# RewardRolloutFilter and EntropyRolloutFilter): groups are consecutive rows of the (num_groups, group_size) view


def _ragen2_select(scores: torch.Tensor, strategy: str, value: float, largest: bool, include_zero: bool) -> list[int]:
    scores = scores.float()
    num_groups = scores.numel()
    indices = torch.arange(num_groups)
    if not include_zero:
        keep = torch.abs(scores) > 1e-10
        scores, indices = scores[keep], indices[keep]
        if indices.numel() == 0:
            return []
    if strategy == "top_k":
        k = max(min(int(value * num_groups), indices.numel()), 1)
        local = (scores if largest else -scores).topk(k).indices
        return sorted(indices[local].tolist())
    if value >= 1.0:
        return sorted(indices.tolist())
    sorted_scores, order = torch.sort(scores, descending=largest)
    threshold = value * scores.sum() - 0.01
    total, count = 0.0, 0
    for score in sorted_scores:
        if total >= threshold or score.item() <= 0:
            break
        total += score.item()
        count += 1
    return sorted(indices[order[:count]].tolist()) if total >= threshold else []


def _ragen2_group_scores(metric: str, rewards: torch.Tensor, entropy: torch.Tensor, groups: int) -> torch.Tensor:
    if metric == "reward_sum":
        return rewards.view(groups, -1).sum(dim=-1)
    return entropy.view(groups, -1).std(dim=-1)  # entropy_variance: the in-group std of the trajectory entropies


@pytest.mark.parametrize("metric", ["reward_sum", "entropy_variance"])
@pytest.mark.parametrize(("strategy", "value"), [("top_p", 0.9), ("top_p", 0.5), ("top_k", 0.25), ("top_k", 0.5)])
@pytest.mark.parametrize("largest", [True, False])
def test_new_metrics_select_as_ragen2(metric, strategy, value, largest):
    rng, compared = np.random.default_rng(7), 0
    for _ in range(60):
        groups, size = int(rng.integers(2, 9)), int(rng.integers(2, 6))
        rewards = torch.tensor(rng.choice([0.0, 1.0], size=groups * size) * rng.uniform(0, 1, size=groups * size))
        entropy = torch.tensor(rng.uniform(0.1, 3.0, size=groups * size), dtype=torch.float64)
        include_zero = bool(rng.integers(0, 2))
        group_index = torch.arange(groups).repeat_interleave(size)
        spec = filter_section(
            strategy=strategy, value=value, metric=metric, largest=largest, include_zero=include_zero
        )
        decision = apply_filter(spec, group_index, rewards, entropy=entropy)
        kept = sorted({int(g) for g, k in zip(group_index, decision.kept, strict=True) if k})
        expected_scores = _ragen2_group_scores(metric, rewards, entropy, groups)
        if len(set(expected_scores.float().tolist())) < groups:
            continue  # ties: RAGEN-2's torch.sort/topk order is unspecified, ours goes to the lower group id
        assert kept == _ragen2_select(expected_scores, strategy, value, largest, include_zero), (rewards, entropy)
        assert torch.allclose(decision.metric_value, expected_scores.repeat_interleave(size))
        compared += 1
    assert compared >= 40


def test_reward_sum_and_entropy_variance_by_hand():
    group_index = torch.tensor([0, 0, 0, 1, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.5, -0.1], dtype=torch.float64)
    entropy = torch.tensor([1.0, 2.0, 3.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    summed = apply_filter(filter_section(metric="reward_sum", value=0.5), group_index, rewards)
    assert summed.metric_value.tolist() == pytest.approx([2.0] * 3 + [0.9] * 3)
    assert summed.kept.tolist() == [True] * 3 + [False] * 3
    spread = apply_filter(filter_section(metric="entropy_variance", value=0.5), group_index, rewards, entropy=entropy)
    assert spread.metric_value.tolist() == pytest.approx([1.0] * 3 + [0.0] * 3)  # std of 1, 2, 3 is 1
    with pytest.raises(ValueError, match="needs the per-trajectory entropy"):
        apply_filter(filter_section(metric="entropy_variance"), group_index, rewards)


def test_filter_inputs_take_the_full_entropy_when_given():
    table = pa.table(
        {
            "group_id": [0, 0],
            "total_reward": [1.0, 0.0],
            "response_length": [2, 4],
            "behavior_logprobs": [[-1.0, -1.0], [-0.5, -0.5, -0.5, -0.5]],
        }
    )
    _, _, sampled, _ = filter_inputs(table, "entropy_variance")
    assert sampled.tolist() == pytest.approx([1.0, 0.5])  # -sum(logprobs) / length
    _, _, full, _ = filter_inputs(table, "entropy_variance", lambda rows: torch.tensor([0.25, 0.75]))
    assert full.tolist() == [0.25, 0.75]
    assert filter_inputs(table, "reward_sum", lambda rows: 1 / 0)[2] is None  # not called for other metrics


def test_full_distribution_entropy_equals_a_direct_softmax():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=37,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = Qwen2ForCausalLM(config).eval()
    rows = [[3, 5, 7, 9, 11, 2], [4, 6, 8], [1, 2, 3, 4, 5, 6, 7]]
    masks = [[0, 0, 1, 1, 0, 1], [0, 1, 1], [0, 0, 0, 1, 1, 0, 0]]
    temperature = 0.7
    got = trajectory_entropy(model, TokenRows.of(rows, masks), pad_id=0, temperature=temperature, batch_size=2)
    for row, mask, value in zip(rows, masks, got.tolist(), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([row])).logits[0].double() / temperature  # (T, V)
        entropies = []
        for t, trained in enumerate(mask):
            if trained:
                p = torch.softmax(logits[t - 1], dim=-1)  # the distribution token t was drawn from
                entropies.append(float(-(p * p.log()).sum()))
        assert value == pytest.approx(sum(entropies) / len(entropies), rel=1e-5)
    # two sequences packed in one row are scored separately: the same values as the rows on their own
    packed = trajectory_entropy(
        model, TokenRows.of([rows[1] + rows[0]], [masks[1] + masks[0]], [[3, 6]]), 0, temperature
    )
    n0, n1 = sum(masks[0]), sum(masks[1])
    assert packed.item() == pytest.approx((got[0].item() * n0 + got[1].item() * n1) / (n0 + n1), rel=1e-5)


def test_soft_advantage_weights_by_hand():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 2, 2, 3])
    # group stds (unbiased): g0 sqrt(.5) = .7071, g1 0, g2 sqrt(1/3) = .5774, g3 one member -> 1.0 (veRL's GRPO)
    expected = [math.sqrt(0.5)] * 2 + [0.0] * 2 + [math.sqrt(1 / 3)] * 4 + [1.0]
    weights = soft_advantage_weights(scores, groups)
    assert weights.tolist() == pytest.approx([v / (1.0 + 1e-6) for v in expected], rel=1e-6)


@pytest.mark.parametrize(
    ("mode", "share", "factor"), [("none", 0.25, 1.0), ("linear", 0.25, 0.25), ("sqrt", 0.25, 0.5)]
)
def test_filter_loss_scale(mode, share, factor):
    assert filter_loss_scale(mode, share) == factor


def test_scaled_advantages_applies_both_in_ragen2s_order():
    config = build_config(overrides=["algorithm.soft_advantage_reweight=true", "algorithm.filter_loss_scaling=sqrt"])
    groups = torch.tensor([0, 0, 1, 1])
    token_rewards = torch.tensor([[0.0, 2.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # scores 2, 0 | 1, 0
    advantages = torch.ones(4, 2)
    inputs = UpdateInputs(batch=None, scores=token_rewards.sum(-1), group_index=groups, kept_group_share=0.64)
    metrics: dict[str, float] = {}
    out = scaled_advantages(config.algorithm, advantages, token_rewards, inputs, metrics)
    std0, std1 = math.sqrt(2.0), math.sqrt(0.5)  # unbiased stds of (2, 0) and (1, 0)
    expected = [std0 / (std0 + 1e-6) * 0.8] * 2 + [std1 / (std0 + 1e-6) * 0.8] * 2  # sqrt(0.64) = 0.8
    assert out[:, 0].tolist() == pytest.approx(expected, rel=1e-6)
    assert metrics["actor/filter_loss_scale"] == pytest.approx(0.8)
    assert metrics["actor/soft_reweight_min"] == pytest.approx(0.5, rel=1e-5)
    untouched = scaled_advantages(build_config().algorithm, advantages, token_rewards, inputs, {})
    assert torch.equal(untouched, advantages)


def test_ragen2_preset_is_its_recommended_filter():
    algorithm = build_config(overrides=["algorithm.preset=ragen2"]).algorithm
    assert (
        filter_strategy(algorithm.filter),
        algorithm.filter_ratio,
        filter_metric(algorithm),
        algorithm.filter_top_p_mode,
        algorithm.filter_include_zero,
        keeps_largest(algorithm),
    ) == ("top_p", 0.9, "reward_std", "linear", False, True)
    assert (algorithm.clip_low, algorithm.clip_high, algorithm.kl_coef) == (0.2, 0.28, 0.0)
    assert {k: getattr(algorithm, k) for k in PRESETS["ragen2"]} == PRESETS["ragen2"]
    overridden = build_config(overrides=["algorithm.preset=ragen2", "algorithm.filter_ratio=0.95"]).algorithm
    assert overridden.filter_ratio == 0.95 and overridden.filter == "top_p"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.filter_entropy=full"], "filter_entropy=full only applies to the entropy metrics"),
        (
            ["algorithm.filter=top_k", "algorithm.filter_metric=entropy", "algorithm.filter_entropy=partial"],
            "filter_entropy",
        ),
        (["algorithm.soft_advantage_reweight=true", "algorithm.adv_estimator=gae"], "adv_estimator=grpo"),
        (["algorithm.filter_loss_scaling=cube"], "filter_loss_scaling"),
        (
            ["algorithm.filter=top_k", "algorithm.filter_metric=entropy_variance", "rollout.backend=scripted"],
            "algorithm.filter_entropy=full",
        ),
        (["algorithm.filter=std", "algorithm.filter_metric=reward_sum"], "set algorithm.filter=top_k"),
    ],
)
def test_bad_combinations_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(overrides=overrides)


def test_full_entropy_with_scripted_rows_is_allowed():
    config = build_config(
        overrides=[
            "algorithm.filter=top_k",
            "algorithm.filter_metric=entropy_variance",
            "algorithm.filter_entropy=full",
            "rollout.backend=scripted",
        ]
    )
    assert filter_metric(config.algorithm) == "entropy_variance"
