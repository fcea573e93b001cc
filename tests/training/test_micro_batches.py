"""Micro-batches by token budget: how rows are bucketed by length, and that an update over token-budget micro-batches
has the gradient of one plain pass over the whole mini-batch (as row micro-batches do), on a real DeepSpeed engine."""

import copy

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.algos import grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig, build_config
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.training import ActorEngine, OptimConfig, collate
from ragen_core.training.actor import micro_batch_passes
from ragen_core.training.parallel import MicroBatchPlan, micro_batches, shard_micro_batches
from ragen_core.update.advantages import trajectory_token_rewards

# entropy off: the gradient is then the surrogate's alone, A * grad(log p) at ratio 1 (inside the clip range)
ALGORITHM = AlgorithmConfig(
    policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.0, loss_agg_mode="token-mean"
)


# -- planning ----------------------------------------------------------------------------------------------------
def test_rows_are_bucketed_longest_first_under_the_budget():
    rows = [10, 11, 12, 13, 14, 15]
    lengths = [5, 40, 12, 38, 6, 11]
    # sorted: 11 (40), 13 (38), 12 (12), 15 (11), 14 (6), 10 (5); budget 80: 2 x 40 = 80 fits, a third (3 x 40) not;
    # then 12 alone costs 12, + 15 -> 2 x 12, + 14 -> 3 x 12, + 10 -> 4 x 12 = 48
    assert micro_batches(rows, 8, lengths, 80) == [[11, 13], [12, 15, 14, 10]]
    assert micro_batches(rows, 3, lengths, 80) == [[11, 13], [12, 15, 14], [10]]  # the row cap holds too
    assert micro_batches(rows, 8, lengths, 30) == [[11], [13], [12, 15], [14, 10]]  # 40 > 30: a pass alone
    assert micro_batches(rows, 4, None, None) == [[10, 11, 12, 13], [14, 15]]  # no budget: rows in order


def test_a_budget_never_splits_a_batch_that_fits_and_never_exceeds_itself():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        n = int(torch.randint(1, 30, (1,), generator=generator))
        lengths = torch.randint(1, 200, (n,), generator=generator).tolist()
        budget = int(torch.randint(1, 1000, (1,), generator=generator))
        chunks = micro_batches(list(range(n)), 64, lengths, budget)
        assert sorted(r for chunk in chunks for r in chunk) == list(range(n))
        for chunk in chunks:
            padded = len(chunk) * max(lengths[r] for r in chunk)
            assert padded <= budget or len(chunk) == 1
        if n * max(lengths) <= budget:
            assert len(chunks) == 1


def test_ranks_share_the_token_budget_micro_batches():
    lengths = [5, 40, 12, 38, 6, 11]
    rank0 = shard_micro_batches(list(range(6)), 8, 0, 2, lengths, 30)
    rank1 = shard_micro_batches(list(range(6)), 8, 1, 2, lengths, 30)
    assert rank0 == [MicroBatchPlan([1], 1.0), MicroBatchPlan([2, 5], 1.0)]
    assert rank1 == [MicroBatchPlan([3], 1.0), MicroBatchPlan([4, 0], 1.0)]


def test_the_config_uses_a_token_budget_by_default_and_rows_on_request():
    assert build_config({}).actor.micro_batch_tokens == 8192
    assert build_config({}, ["actor.micro_batch_tokens=null"]).actor.micro_batch_tokens is None
    assert ActorConfig().gradient_checkpointing is False and ActorConfig().attn_implementation == "auto"


# -- the same gradient -------------------------------------------------------------------------------------------
def sampled_bandit_batch(model, tokenizer, max_new_tokens: int, seed: int):
    """Eight sampled Bandit rollouts with prompts of different lengths (two instances, long and short replies) and
    their GRPO advantages under fixed scores."""
    spec = RolloutSpec("bandit", [4, 5], 4, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, max_new_tokens), ChatFormatter(tokenizer), seed=seed)
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.0, 0.1])
    groups = torch.tensor([r.group_id for r in records])
    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    return batch, advantages


@pytest.fixture(scope="module")
def uneven_batch(tiny_policy):
    return sampled_bandit_batch(*tiny_policy, max_new_tokens=24, seed=11)


def _sgd_engine(model: torch.nn.Module, tokens: int | None, rows: int) -> ActorEngine:
    # SGD at lr 1 without decay or clipping: the step is minus the gradient, read back from the weights
    optim = OptimConfig(
        lr=1.0, weight_decay=0.0, grad_clip=1e9, micro_batch_size=rows, optimizer="sgd", micro_batch_tokens=tokens
    )
    return ActorEngine(copy.deepcopy(model), optim)


def _engine_gradient(model, batch, advantages, tokens, rows):
    actor = _sgd_engine(model, tokens, rows)
    before = [p.detach().clone() for p in actor.module.parameters()]
    old = actor.score(batch)
    actor.policy_update(batch, advantages, old, ALGORITHM, ActorConfig(mini_batch_size=len(batch)), shuffle_seed=0)
    passes = micro_batch_passes(list(range(len(batch))), batch, actor.optim, lockstep=True)
    return [b - a for b, a in zip(before, actor.module.parameters(), strict=True)], passes


def _plain_gradient(model, batch, advantages):
    """Independently: one plain forward/backward of the whole batch, no engine, no micro-batches: the token-mean
    clipped surrogate at ratio 1 has the gradient -sum(A grad log p) / trained tokens."""
    plain = copy.deepcopy(model).train()
    logits = plain(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:]
    loss = -(advantages[:, 1:] * logp * mask).sum() / mask.sum()
    loss.backward()
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in plain.parameters()]


def test_token_budget_micro_batches_give_the_plain_gradient(tiny_policy, uneven_batch):
    model, _ = tiny_policy
    batch, advantages = uneven_batch
    lengths = batch.attention_mask.sum(1)
    assert int(lengths.max()) > int(lengths.min())  # uneven rows, or the bucketing would be moot
    budget = int(lengths.max()) * 2  # a few passes, rows of like length together
    by_tokens, passes = _engine_gradient(model, batch, advantages, budget, len(batch))
    by_rows, row_passes = _engine_gradient(model, batch, advantages, None, 3)
    assert len(passes) > 1 and all(
        len(p.rows) * int(lengths[p.rows].max()) <= budget or len(p.rows) == 1 for p in passes
    )
    assert [p.rows for p in passes] != [p.rows for p in row_passes]
    expected = _plain_gradient(model, batch, advantages)
    assert max(float(g.abs().max()) for g in expected) > 1e-4  # a gradient worth comparing
    for got_tokens, got_rows, want in zip(by_tokens, by_rows, expected, strict=True):
        torch.testing.assert_close(got_tokens, want, rtol=1e-4, atol=2e-6)
        torch.testing.assert_close(got_rows, want, rtol=1e-4, atol=2e-6)
