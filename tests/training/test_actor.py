import copy

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.algos import grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.training import ActorEngine, OptimConfig, collate, token_logprobs, update_schedule
from ragen_core.update.advantages import trajectory_token_rewards

ALGORITHM = AlgorithmConfig(
    policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001, loss_agg_mode="token-mean"
)
SCHEDULE = ActorConfig(mini_batch_size=8, ppo_epochs=1)


@pytest.fixture(scope="module")
def rollout_batch(tiny_policy):
    model, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [4, 5], 4, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 12), ChatFormatter(tokenizer), seed=3)
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.0, 0.1])  # synthetic, so both signs of advantage occur
    groups = torch.tensor([r.group_id for r in records])
    return batch, scores, groups


def _engine(tiny_policy, micro_batch_size: int, lr: float = 1e-2, optimizer: str = "adamw") -> ActorEngine:
    model, _ = tiny_policy
    optim = OptimConfig(lr=lr, weight_decay=0.0, grad_clip=1.0, micro_batch_size=micro_batch_size, optimizer=optimizer)
    return ActorEngine(copy.deepcopy(model), optim)


def _update(actor, batch, scores, groups, algorithm=ALGORITHM, schedule=SCHEDULE, seed=0):
    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    return actor.policy_update(batch, advantages, actor.score(batch), algorithm, schedule, shuffle_seed=seed)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_does_not_change_the_update(tiny_policy, rollout_batch, mode):
    batch, scores, groups = rollout_batch
    config = ALGORITHM.model_copy(update={"loss_agg_mode": mode})
    # SGD: Adam's first step divides by |g| and so amplifies float noise on near-zero gradients
    whole, split = _engine(tiny_policy, 8, 0.5, "sgd"), _engine(tiny_policy, 3, 0.5, "sgd")
    _update(whole, batch, scores, groups, config)
    _update(split, batch, scores, groups, config)
    for a, b in zip(whole.module.parameters(), split.module.parameters(), strict=False):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_row_without_trained_tokens_changes_no_sequence_mean_update(tiny_policy, rollout_batch, mode):
    """A row whose loss mask is empty (nothing to train) is not a sequence of the mean: the update with it, over
    micro-batches of 3, equals the update on the batch without it."""
    batch, scores, groups = rollout_batch
    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    empty = copy.deepcopy(batch)
    empty.loss_mask[2] = 0.0
    rest = [0, 1, 3, 4, 5, 6, 7]
    results = []
    for rows_batch, adv, size in ((empty, advantages, 8), (batch.select(rest), advantages[rest], 7)):
        config = ALGORITHM.model_copy(update={"loss_agg_mode": mode})
        schedule = SCHEDULE.model_copy(update={"mini_batch_size": size})
        actor = _engine(tiny_policy, 3, 0.5, "sgd")
        old = actor.score(rows_batch)
        actor.policy_update(rows_batch, adv[:, : rows_batch.input_ids.shape[1]], old, config, schedule, 0)
        results.append(actor)
    for a, b in zip(results[0].module.parameters(), results[1].module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_update_moves_logprobs_in_the_direction_of_the_advantage(tiny_policy, rollout_batch):
    batch, scores, groups = rollout_batch
    actor = _engine(tiny_policy, 8, lr=1e-3)
    before = actor.score(batch)
    stats = _update(actor, batch, scores, groups)
    after = actor.score(batch)
    per_sequence = ((after - before) * batch.loss_mask).sum(1)
    best = torch.tensor([0, 5])  # highest score of each group
    worst = torch.tensor([1, 6])
    assert bool((per_sequence[best] > per_sequence[worst]).all())
    assert {"actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/clipfrac_upper", "actor/lr"} <= set(stats)
    assert stats["actor/grad_norm"] > 0


def test_sft_lowers_the_loss(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", list(range(8)), 2, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    actor = _engine(tiny_policy, 4, lr=1e-2)
    losses = [actor.sft_update(batch, batch_size=8, shuffle_seed=epoch)["sft/loss"] for epoch in range(8)]
    assert losses[-1] < 0.4 * losses[0]  # observed: 5.8 -> 1.6


def test_score_matches_a_plain_forward(tiny_policy, rollout_batch):
    batch, _, _ = rollout_batch
    actor = _engine(tiny_policy, 3)
    model, _ = tiny_policy
    with torch.no_grad():
        expected, _ = token_logprobs(model.eval(), batch)
    torch.testing.assert_close(
        actor.score(batch) * batch.attention_mask, expected * batch.attention_mask, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("rows", "mini", "epochs", "k", "expected_steps"),
    [(8, 4, 1, None, 2), (8, 4, 2, None, 4), (10, 4, 1, None, 3), (8, 4, 1, 5, 5), (8, 16, 1, 2, 2), (32, 8, 3, 1, 1)],
)
def test_update_schedule_counts_steps_and_keeps_the_batch_size(rows, mini, epochs, k, expected_steps):
    import numpy as np

    steps = update_schedule(rows, mini, epochs, k, np.random.default_rng(0))
    assert len(steps) == expected_steps
    if k is not None:
        assert all(len(step) == mini for step in steps)  # Online-k: the update batch size is fixed
        seen = [row for step in steps for row in step]
        # consecutive passes: every row is used once before any is used twice
        assert len(set(seen[:rows])) == min(rows, len(seen))
    else:
        assert sorted(row for step in steps for row in step) == sorted(list(range(rows)) * epochs)


def test_online_k_takes_k_optimizer_steps_per_rollout_batch(tiny_policy, rollout_batch):
    batch, scores, groups = rollout_batch
    for k in (1, 3):
        actor = _engine(tiny_policy, 4, lr=1e-3)
        schedule = SCHEDULE.model_copy(update={"mini_batch_size": 4, "online_k": k})
        steps_before = actor.engine.global_steps
        stats = _update(actor, batch, scores, groups, schedule=schedule)
        assert actor.engine.global_steps - steps_before == k  # DeepSpeed's own step counter
        assert stats["actor/optimizer_steps"] == k
