"""Key/value-cache reuse in the Hugging Face backend: which rows continue, and that continued turns sample from
exactly the log-probs a fresh encoding of the same ids gives (also after the weights change)."""

from __future__ import annotations

import copy

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, TurnContext, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.kv_reuse import ChunkState, plan_chunks
from ragen_core.training import collate, token_logprobs


def _state(prompts, ids):
    return ChunkState(prompts, ids, torch.zeros(len(ids), 1), torch.zeros(len(ids), 1), None)


def test_plan_continues_only_the_same_trajectory_with_the_same_history():
    a, b, c = [1, 2, 9, 7], [1, 2, 8, 7], [1, 2, 3]
    state = _state([a, b, c], [[1, 2, 9], [1, 2, 5], [1, 2, 3]])
    same_content_other_list = [1, 2, 9, 7]
    chunks = plan_chunks([a, b, c, same_content_other_list], [state], batch_size=2)
    # a extends its row; b's history changed; c has nothing new; the copy is another trajectory
    assert [(ch.indices, ch.previous is state, ch.rows) for ch in chunks] == [
        ([0], True, [0]),
        ([1, 2], False, []),
        ([3], False, []),
    ]


def _rescored_error(model, tokenizer, records):
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs(model.eval(), batch)
    worst = 0.0
    for row, record in enumerate(records):
        mask = torch.tensor(record.loss_mask, dtype=torch.bool)
        stored = torch.tensor(record.behavior_logprobs)[mask]
        worst = max(worst, float((logprobs[row, : len(record.input_ids)][mask] - stored).abs().max()))
    return worst


def test_multi_turn_rollouts_with_reuse_match_a_fresh_encoding(tiny_policy):
    model, tokenizer = tiny_policy
    spec = RolloutSpec("sokoban", [3, 4], 3, max_turns=3, max_actions_per_turn=2, max_actions_per_traj=6)
    formatter = ChatFormatter(tokenizer)
    reused = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 16), formatter, seed=7)
    fresh = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 16, reuse_cache=False), formatter, seed=7)
    assert max(len(r.turns) for r in reused) == 3
    assert _rescored_error(model, tokenizer, reused) < 1e-4
    assert _rescored_error(model, tokenizer, fresh) < 1e-4
    again = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 16), formatter, seed=7)
    assert [r.input_ids for r in again] == [r.input_ids for r in reused]  # reproducible from the seed


def test_changed_weights_are_never_read_from_a_kept_cache(tiny_policy):
    base, tokenizer = tiny_policy
    model = copy.deepcopy(base)
    backend = HFBackend(model, tokenizer, 1.0, 8)
    formatter = ChatFormatter(tokenizer)
    prompts = [formatter.start("Turn 1: pick an arm.") for _ in range(3)]
    first = backend.generate([TurnContext(p, None, 1, 1, True) for p in prompts], seed=1)
    for prompt, generation in zip(prompts, first, strict=True):
        prompt.extend(generation.token_ids + formatter.encode("\nTurn 2: again."))
    # New weights, as after an update. A cache kept from the old weights would be off by ~2 nats here; fp32 rounding
    # between the batched, cached generation and this one-row scoring is ~1e-6. (Noise of 0.5 made the activations so
    # large that rounding alone reached 7e-5 of the 1e-4 tolerance, and a busy machine's kernel choice 1.006e-4.)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    second = backend.generate([TurnContext(p, None, 1, 1, True) for p in prompts], seed=2)
    for prompt, generation in zip(prompts, second, strict=True):
        ids = prompt + generation.token_ids
        batch = collate([ids], [[0] * len(prompt) + [1] * len(generation.token_ids)], tokenizer.pad_token_id)
        with torch.no_grad():
            logprobs, _ = token_logprobs(model.eval(), batch)
        assert logprobs[0, len(prompt) :].tolist() == pytest.approx(generation.logprobs, abs=1e-4)
