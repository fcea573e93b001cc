"""The GPU bench's synthetic batch (issue 41): replies drawn from the run's seeds, of a random-weight model's lengths,
each a valid answer, so the envs give varying rewards; the same seeds give the same batch in any process."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.synthetic_batch import SyntheticBackend, filler_ids
from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, run_rollouts

PROJECT = Path(__file__).resolve().parents[2]


def _records(tokenizer, env="bandit", max_new_tokens=64, seed=5, prefix=""):
    spec = RolloutSpec(env, list(range(10, 18)), 16, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
    backend = SyntheticBackend(tokenizer, max_new_tokens)
    return run_rollouts(spec, backend, ChatFormatter(tokenizer, reply_prefix=prefix), seed=seed)


def _digest(records) -> str:
    rows = [[r.input_ids, r.loss_mask, r.behavior_logprobs, r.total_reward] for r in records]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


@pytest.mark.parametrize(("env", "prefix"), [("bandit", ""), ("sokoban", "<think>")])
def test_every_reply_is_a_valid_answer_within_the_token_limit(tiny_policy, env, prefix):
    _, tokenizer = tiny_policy
    records = _records(tokenizer, env, prefix=prefix)
    turns = [turn for record in records for turn in record.turns]
    assert all(turn.format_ok and turn.valid and len(turn.actions) == 1 for turn in turns)
    assert all(0 < turn.response_tokens <= 64 and not turn.truncated for turn in turns)
    if env == "bandit":  # a random arm per reply: both arms, and rewards that differ between groups
        assert {turn.actions[0] for turn in turns} == {"Phoenix", "Dragon"}
        assert len({round(r.total_reward, 6) for r in records}) > 1


def test_reply_lengths_follow_a_random_models_stop_rate(tiny_policy):
    """A stop token drawn with probability 1/V per position: a share (1 - 1/V) ** (limit - 1) of the replies runs to
    the limit (computed here from V; ~88% at 128 tokens with the ~1k-token vocabulary)."""
    _, tokenizer = tiny_policy
    backend = SyntheticBackend(tokenizer, 128)
    from ragen_core.envs import make_env
    from ragen_core.rollout.types import TurnContext

    env = make_env("bandit")
    env.reset(0)
    replies = backend.generate([TurnContext([1], env, 1, 1, True)] * 4000, seed=3)
    at_limit = sum(len(reply.token_ids) == 128 for reply in replies) / len(replies)
    expected = (1 - 1 / len(tokenizer)) ** 127
    assert abs(at_limit - expected) < 0.03, (at_limit, expected)
    assert all(reply.token_ids[-1] == tokenizer.eos_token_id for reply in replies)
    assert all(reply.logprobs == [reply.logprobs[0]] * len(reply.token_ids) for reply in replies)


def test_the_filler_opens_no_tag_and_holds_no_special_token(tiny_policy):
    _, tokenizer = tiny_policy
    ids = filler_ids(tokenizer)
    assert len(ids) > 0.5 * len(tokenizer)
    assert not set(ids.tolist()) & set(tokenizer.all_special_ids)
    assert all("<" not in tokenizer.decode([i]) and ">" not in tokenizer.decode([i]) for i in ids.tolist())


@pytest.mark.process  # another process
def test_the_same_seeds_give_the_same_batch_in_another_process(tiny_policy, tiny_model_dir):
    """What the in-process and the launched bench both rely on: nothing but the seeds decides the batch."""
    _, tokenizer = tiny_policy
    here = _records(tokenizer)
    assert _digest(_records(tokenizer)) == _digest(here) != _digest(_records(tokenizer, seed=6))
    script = (
        "import sys; from ragen_core.policy import load_policy; from tests.benchmarks.test_synthetic_batch import "
        f"_records, _digest; print(_digest(_records(load_policy({str(tiny_model_dir)!r})[1])))"
    )
    other = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip().splitlines()[-1] == _digest(here)
