import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.training import collate, token_logprobs


def _spec(max_turns=1, groups=(11, 12, 13), group_size=4):
    return RolloutSpec(
        "bandit", list(groups), group_size, max_turns=max_turns, max_actions_per_turn=1, max_actions_per_traj=max_turns
    )


@pytest.mark.parametrize(
    ("env", "mode", "window", "prefix"),
    [
        ("bandit", "full", None, ""),
        ("frozen_lake", "full", None, "<think>"),
        ("frozen_lake", "limited_multi_turn", 1, ""),
        ("frozen_lake", "limited_multi_turn", 2, "<think>"),
        ("sokoban", "single_turn", 2, "<think>"),
    ],
)
def test_stored_ids_rescored_reproduce_behavior_logprobs(tiny_policy, env, mode, window, prefix):
    # windowed modes: the row packs one sequence per turn, and the packed batch must score each reply in its own window
    model, tokenizer = tiny_policy
    backend = HFBackend(model, tokenizer, temperature=1.0, max_new_tokens=24)
    spec = RolloutSpec(
        env,
        [11, 12, 13],
        4,
        max_turns=3,
        max_actions_per_turn=1,
        max_actions_per_traj=3,
        context_window_mode=mode,
        max_context_window=window,
    )
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer, reply_prefix=prefix), seed=5)
    assert any(len(r.turns) > 1 for r in records), "the untrained model should need several turns somewhere"
    assert all(turn.response.startswith(prefix) for r in records for turn in r.turns)
    assert all((r.segment_lengths is None) == (mode == "full") for r in records)
    batch = collate(
        [r.input_ids for r in records],
        [r.loss_mask for r in records],
        tokenizer.pad_token_id,
        [r.segment_lengths for r in records],
    )
    with torch.no_grad():
        logprobs, _ = token_logprobs(model.eval(), batch)
    for row, record in enumerate(records):
        n = len(record.input_ids)
        stored = torch.tensor(record.behavior_logprobs)
        mask = torch.tensor(record.loss_mask, dtype=torch.bool)
        assert record.loss_mask[0] == 0
        diff = (logprobs[row, :n][mask] - stored[mask]).abs().max()
        assert float(diff) < 1e-4
        assert bool((stored[~mask] == 0).all())


def test_sampling_is_reproducible_from_the_seed(tiny_policy):
    model, tokenizer = tiny_policy
    backend = HFBackend(model, tokenizer, temperature=1.0, max_new_tokens=16)
    formatter = ChatFormatter(tokenizer)
    first = run_rollouts(_spec(), backend, formatter, seed=1)
    again = run_rollouts(_spec(), backend, formatter, seed=1)
    other = run_rollouts(_spec(), backend, formatter, seed=2)
    assert [r.input_ids for r in first] == [r.input_ids for r in again]
    assert [r.input_ids for r in first] != [r.input_ids for r in other]


def test_temperature_is_applied_before_the_logprobs(tiny_policy):
    model, tokenizer = tiny_policy
    backend = HFBackend(model, tokenizer, temperature=0.5, max_new_tokens=8)
    record = run_rollouts(_spec(groups=(3,), group_size=1), backend, ChatFormatter(tokenizer), seed=0)[0]
    batch = collate([record.input_ids], [record.loss_mask], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model.eval()(input_ids=batch.input_ids).logits[0, :-1] / 0.5
    expected = torch.log_softmax(logits, -1).gather(1, batch.input_ids[0, 1:, None]).squeeze(1)
    mask = torch.tensor(record.loss_mask[1:], dtype=torch.bool)
    assert float((expected[mask] - torch.tensor(record.behavior_logprobs[1:])[mask]).abs().max()) < 1e-4


def _invalid_then_arm():
    """Turn 1: an invalid action (penalised, the bandit stays open); turn 2: the first listed arm."""
    seen: set[int] = set()

    def policy(context, rng):
        first = id(context.env) not in seen
        seen.add(id(context.env))
        return ["Unicorn"] if first else [context.env.action_names[0]]

    return policy


def test_multi_turn_sequence_layout_and_penalty(tiny_policy):
    _, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    record = run_rollouts(
        _spec(max_turns=2, groups=(7,), group_size=1),
        ScriptedBackend(_invalid_then_arm(), tokenizer),
        formatter,
        seed=0,
    )[0]
    assert [t.actions for t in record.turns] == [[], [record.turns[1].actions[0]]]
    assert [t.valid for t in record.turns] == [False, True]
    assert record.format_penalty == pytest.approx(-0.1)
    assert record.total_reward == pytest.approx(record.env_reward - 0.1)
    assert record.behavior_logprobs is None and record.behavior_source == "scripted"
    # the sequence is: prompt (0s), reply 1 (1s), env text of turn 2 (0s), reply 2 (1s)
    runs, previous = [], None
    for value in record.loss_mask:
        if value != previous:
            runs.append(value)
            previous = value
    assert runs == [0, 1, 0, 1]
    # the env text between the replies is exactly the template's continuation, tokenised once
    text = tokenizer.decode(record.input_ids)
    assert "Reward: 0\nTurn 2:" in text and text.count("<|im_start|>assistant") == 2
    assert record.input_ids[-1] == tokenizer.eos_token_id
    assert record.turns[1].observation.startswith("Reward: 0\nTurn 2:")


def test_the_think_prefix_ends_every_prompt_and_starts_every_parsed_reply(tiny_policy):
    """RAGEN's prompts end with <think> after the assistant header: it is prompt (mask 0), the trained tokens are
    what follows, and the reply that is parsed and stored is the prefix plus those tokens."""
    _, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer, reply_prefix="<think>")
    spec = RolloutSpec("frozen_lake", [3, 4], 2, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), formatter, seed=0)
    plain = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    prefix_ids = formatter.encode("<think>")
    for record, without in zip(records, plain, strict=True):
        assert [t.response for t in without.turns] == [t.response for t in record.turns]  # same replies as parsed
        assert all(t.response.startswith("<think>") and t.format_ok and t.think for t in record.turns)
        mask, ids = record.loss_mask, record.input_ids
        starts = [i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0]
        assert len(starts) == len(record.turns)
        for start, turn in zip(starts, record.turns, strict=True):
            assert ids[start - len(prefix_ids) : start] == prefix_ids  # the prompt ends with the prefix
            end = start
            while end < len(mask) and mask[end] == 1:
                end += 1
            generated = tokenizer.decode(ids[start:end], skip_special_tokens=True)
            assert "<think>" + generated == turn.response  # trained tokens: the reply without the prefix
