"""Reusing the sampler's stored log-probs as PPO's old log-probs (actor.reuse_behavior_logprobs).

An on-policy batch (the policy's own weights through Hugging Face generate, temperature 1, no top-k/top-p, fp32)
stores exactly the log-probs a re-scoring forward would give, so the update can skip that forward; the first
optimizer step's forward watches the match (actor/behavior_logprob_gap)."""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.algos import entropy_from_logits, grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig, ConfigError, build_config, stored_config
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.training import ActorEngine, OptimConfig, collate, token_logprobs, update_schedule
from ragen_core.training.actor import GAP_METRIC
from ragen_core.training.batch import LogprobEntropy, trained_columns
from ragen_core.training.starpo import reuses_behavior_logprobs, starpo_update
from ragen_core.update.advantages import trajectory_token_rewards
from ragen_core.update.inputs import UpdateInputs
from ragen_core.update.rows import TokenRows

ALGORITHM = AlgorithmConfig(
    policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001, loss_agg_mode="token-mean"
)
SCHEDULE = ActorConfig(mini_batch_size=6, ppo_epochs=2)


def _table(records) -> pa.Table:
    return pa.table(
        {
            "input_ids": [r.input_ids for r in records],
            "loss_mask": [r.loss_mask for r in records],
            "behavior_source": [r.behavior_source for r in records],
            "behavior_logprobs": [r.behavior_logprobs for r in records],
        }
    )


@pytest.fixture(scope="module")
def sampled(tiny_policy):
    """A multi-turn Frozen Lake batch sampled by the tiny policy (later turns continue the key/value cache), its
    stored log-probs collated as the update reads them, and synthetic scores of both signs."""
    model, tokenizer = tiny_policy
    spec = RolloutSpec("frozen_lake", [3, 4, 5], 4, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
    records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 16), ChatFormatter(tokenizer), seed=7)
    assert any(len(r.turns) > 1 for r in records), "the untrained model should need several turns somewhere"
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    stored = TokenRows.from_table(_table(records), logprobs=True).padded_logprobs(batch.loss_mask.shape[1])
    scores = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.0, 0.9, 0.1, 0.3, 0.7, 0.0, 0.4, 1.0])
    groups = torch.tensor([r.group_id for r in records])
    return batch, stored, scores, groups


def _engine(tiny_policy, micro_batch_size: int = 3) -> ActorEngine:
    model, _ = tiny_policy
    # SGD: Adam's first step divides by |g| and so amplifies float noise on near-zero gradients
    optim = OptimConfig(lr=0.5, weight_decay=0.0, grad_clip=1.0, micro_batch_size=micro_batch_size, optimizer="sgd")
    return ActorEngine(copy.deepcopy(model), optim)


def _advantages(batch, scores, groups):
    return grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)[0]


def test_the_stored_logprobs_of_an_on_policy_batch_are_the_rescored_ones(tiny_policy, sampled):
    batch, stored, _, _ = sampled
    trained = batch.loss_mask > 0
    assert int(trained.sum()) > 50
    rescored = _engine(tiny_policy).score(batch)
    gap = float((rescored - stored)[trained].abs().max())
    assert gap < 1e-5, gap
    assert bool((stored[~trained & (batch.attention_mask == 0)] == 0).all())  # padding like the loss mask


def test_an_update_on_the_stored_logprobs_equals_the_update_on_rescored_ones(tiny_policy, sampled):
    batch, stored, scores, groups = sampled
    advantages = _advantages(batch, scores, groups)
    reused, rescored = _engine(tiny_policy), _engine(tiny_policy)
    with_stored = reused.policy_update(batch, advantages, stored, ALGORITHM, SCHEDULE, 3, watch_old_gap=True)
    with_scored = rescored.policy_update(batch, advantages, rescored.score(batch), ALGORITHM, SCHEDULE, 3)
    assert with_stored["actor/optimizer_steps"] == 4  # 12 rows, mini-batches of 6, 2 epochs
    for a, b in zip(reused.module.parameters(), rescored.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/clipfrac_upper", "actor/grad_norm"):
        assert with_stored[key] == pytest.approx(with_scored[key], rel=1e-4, abs=1e-6), key
    assert with_stored[GAP_METRIC] < 1e-5
    assert GAP_METRIC not in with_scored


def test_the_gap_metric_is_the_first_steps_largest_mismatch(tiny_policy, sampled):
    """Old log-probs off by a known amount per row: the metric is the largest offset among the rows of the first
    mini-batch (the schedule's first step, from the same seed), whatever the later steps see."""
    batch, _, scores, groups = sampled
    actor = _engine(tiny_policy)
    offsets = torch.arange(1, len(batch) + 1, dtype=torch.float32) * 0.01  # row r is off by 0.01 (r + 1)
    old = actor.score(batch) + offsets[:, None] * batch.loss_mask
    advantages = _advantages(batch, scores, groups)
    metrics = actor.policy_update(batch, advantages, old, ALGORITHM, SCHEDULE, 11, watch_old_gap=True)
    rng = np.random.default_rng(11)
    first = update_schedule(len(batch), SCHEDULE.mini_batch_size, SCHEDULE.ppo_epochs, None, rng)[0]
    assert sorted(first) != list(range(6))  # a shuffled mini-batch, not simply the first rows
    assert metrics[GAP_METRIC] == pytest.approx(float(offsets[first].max()), abs=1e-5)


def test_starpo_update_reuses_only_when_told_and_both_ways_agree(tiny_policy, sampled):
    batch, stored, scores, groups = sampled
    inputs = UpdateInputs(batch, scores, groups, behavior_logprobs=stored)
    base = ["actor.mini_batch_size=6", "actor.micro_batch_size=3", "algorithm.kl_coef=0"]
    results = {}
    for mode in ("auto", "never"):
        actor = _engine(tiny_policy)
        config = build_config({}, [*base, f"actor.reuse_behavior_logprobs={mode}"])
        results[mode] = (starpo_update(config, actor, None, inputs, 0), actor)
    (auto, reused), (never, rescored) = results["auto"], results["never"]
    assert auto[GAP_METRIC] < 1e-5 and GAP_METRIC not in never
    assert auto["actor/pg_loss"] == pytest.approx(never["actor/pg_loss"], rel=1e-4, abs=1e-6)
    for a, b in zip(reused.module.parameters(), rescored.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "precision", "expected"),
    [
        ([], "fp32", True),
        (["rollout.temperature=0.7"], "fp32", False),
        (["rollout.top_p=0.9"], "fp32", False),
        (["rollout.top_k=5"], "fp32", False),
        (["rollout.backend=vllm"], "fp32", False),
        ([], "bf16", False),
        (["actor.reuse_behavior_logprobs=never"], "fp32", False),
        (["actor.reuse_behavior_logprobs=always", "rollout.temperature=0.7"], "bf16", True),
    ],
)
def test_auto_reuses_only_exactly_on_policy_batches(overrides, precision, expected):
    config = build_config({}, overrides)
    inputs = UpdateInputs(collate([[1, 2]], [[0, 1]], 0), torch.zeros(1), torch.zeros(1), behavior_logprobs=None)
    with_logprobs = UpdateInputs(inputs.batch, inputs.scores, inputs.group_index, behavior_logprobs=torch.zeros(1, 2))
    assert reuses_behavior_logprobs(config, with_logprobs, precision) is expected
    if config.actor.reuse_behavior_logprobs == "always":  # rows without log-probs (scripted ones) cannot be reused
        with pytest.raises(ValueError, match="no behaviour log-probs"):
            reuses_behavior_logprobs(config, inputs, precision)
    else:
        assert reuses_behavior_logprobs(config, inputs, precision) is False


def test_always_is_refused_for_scripted_rollouts_at_load_time():
    with pytest.raises(ConfigError, match="reuse_behavior_logprobs=always"):
        build_config({}, ["rollout.backend=scripted", "actor.reuse_behavior_logprobs=always"])
    assert build_config({}, ["rollout.backend=scripted"]).actor.reuse_behavior_logprobs == "auto"


def test_a_run_stored_before_the_key_replays_with_rescoring():
    """Runs stored before actor.reuse_behavior_logprobs re-scored their old log-probs: reading their config back
    keeps doing so (their replayed updates stay bit for bit), and a config that turns reuse on is a change."""
    from ragen_core.run.decisions import config_changes

    old = build_config().to_dict()
    del old["actor"]["reuse_behavior_logprobs"]
    restored = build_config(stored_config(old))
    assert restored.actor.reuse_behavior_logprobs == "never"
    assert config_changes(old, restored.to_dict()) == []
    assert config_changes(old, build_config().to_dict()) == ["actor.reuse_behavior_logprobs"]


def test_stored_logprobs_are_collated_like_the_loss_mask_and_absent_with_a_scripted_row():
    tokens = {"input_ids": [[1, 2], [3, 4, 5]], "loss_mask": [[0, 1], [0, 1, 1]]}
    table = pa.table({**tokens, "behavior_logprobs": [[0.0, -0.5], [0.0, -1.0, -2.0]]})
    expected = torch.tensor([[0.0, -0.5, 0.0, 0.0], [0.0, -1.0, -2.0, 0.0]])
    stored = TokenRows.from_table(table, logprobs=True).padded_logprobs(4)
    torch.testing.assert_close(stored, expected, rtol=0, atol=0)
    assert TokenRows.from_table(table).padded_logprobs(4) is None  # not asked for
    mixed = pa.table({**tokens, "behavior_logprobs": [[0.0, -0.5], None]})
    assert TokenRows.from_table(mixed, logprobs=True).padded_logprobs(4) is None


def test_entropy_without_grad_is_the_same_metric_and_keeps_no_graph(tiny_policy, sampled):
    batch, _, _, _ = sampled
    model, _ = tiny_policy
    model = copy.deepcopy(model).train()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    expected = entropy_from_logits(logits.detach())
    _, with_grad = token_logprobs(model, batch, with_entropy=True)
    logprobs, detached = token_logprobs(model, batch, with_entropy=True, entropy_grad=False)
    assert with_grad.requires_grad and not detached.requires_grad and logprobs.requires_grad
    torch.testing.assert_close(detached[:, 1:], expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(with_grad.detach(), detached, rtol=0, atol=0)


def test_logprobs_of_the_trained_columns_only_equal_the_full_ones_with_the_same_gradient(tiny_policy, sampled):
    """The update projects only the columns with trained tokens (logits_to_keep) and takes log-probs and entropies
    through the closed-form backward: same values there, and the same gradient of a masked loss as plain autograd
    over the full logits."""
    batch, _, _, _ = sampled
    model, _ = tiny_policy
    model = copy.deepcopy(model).train()
    mask = batch.loss_mask
    columns = trained_columns(mask)
    assert 0 < len(columns) < mask.shape[1] - 1  # the prompts' columns are left out
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0)) * mask

    def loss_and_grad(logprobs, entropy):
        loss = (logprobs * weights).sum() + 0.3 * (entropy * weights).sum()
        return loss, torch.autograd.grad(loss, list(model.parameters()))

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    full_logp = torch.log_softmax(logits, dim=-1)
    plain = torch.cat([torch.zeros(len(batch), 1), full_logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0]], 1)
    plain_entropy = torch.cat([torch.zeros(len(batch), 1), entropy_from_logits(logits)], 1)
    expected_loss, expected_grads = loss_and_grad(plain, plain_entropy)
    logprobs, entropy = token_logprobs(model, batch, with_entropy=True, columns=columns)
    kept = torch.zeros_like(mask, dtype=torch.bool)
    kept[:, columns] = True
    assert bool((logprobs[~kept] == 0).all() and (entropy[~kept] == 0).all())
    torch.testing.assert_close(logprobs[kept], plain[kept], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[kept], plain_entropy[kept], rtol=1e-5, atol=1e-5)
    loss, grads = loss_and_grad(logprobs, entropy)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_closed_form_gradient_of_logprob_and_entropy_passes_gradcheck():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 7, dtype=torch.float64, generator=generator).requires_grad_()
    targets = torch.randint(0, 7, (3, 4), generator=generator)
    assert torch.autograd.gradcheck(LogprobEntropy.apply, (logits, targets))
