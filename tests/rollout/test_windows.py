"""Windowed context modes: each turn's prompt is exactly the expected window, rebuilt here from the stored turns and
an independent replay of the environment, and it is what the backend sampled from."""

import pytest
import torch

from ragen_core.agent import ChatFormatter, first_user_message, history_block, turn_message
from ragen_core.agent.prompts import SYSTEM_PROMPT
from ragen_core.envs import make_env
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend

MAX_TURNS = 4


class Recording:
    """A backend that remembers the prompt ids of every context it was asked to reply to."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []
        self.behavior_source = inner.behavior_source

    def reset(self):
        getattr(self.inner, "reset", lambda: None)()

    def generate(self, contexts, seed):
        self.prompts.append([list(c.prompt_ids) for c in contexts])
        return self.inner.generate(contexts, seed)


def _spec(env, mode, window, actions_per_turn=1):
    return RolloutSpec(
        env,
        [5, 6],
        2,
        max_turns=MAX_TURNS,
        max_actions_per_turn=actions_per_turn,
        max_actions_per_traj=MAX_TURNS * 2,
        context_window_mode=mode,
        max_context_window=window,
    )


def _segments(record):
    """Per turn: (prompt ids, reply ids) of the turn's own sequence; the reply is the single trailing run of 1s."""
    out, start = [], 0
    for length in record.segment_lengths:
        ids, mask = record.input_ids[start : start + length], record.loss_mask[start : start + length]
        cut = mask.index(1)
        assert mask[cut:] == [1] * (length - cut) and sum(mask[:cut]) == 0
        out.append((ids[:cut], ids[cut:]))
        start += length
    assert start == len(record.input_ids)
    return out


def _replay(spec, record):
    """States and action budgets each turn's prompt showed, by replaying the stored actions in a fresh env."""
    env = make_env(spec.env_name)
    state, _ = env.reset(record.env_seed)
    budget, shown = spec.max_actions_per_traj, []
    for turn in record.turns:
        shown.append((state, budget))
        for action in turn.actions:
            state = env.step(action)[0]
            budget -= 1
    return env, shown


def _expected_text(tokenizer, spec, record, turn, reply_texts):
    """The window of ``turn`` as chat messages, rendered by the tokenizer's own template."""
    env, shown = _replay(spec, record)
    think, first = spec.enable_think, max(0, turn - spec.max_context_window + 1)
    rules = (env.instruction(), env.action_names, spec.max_actions_per_turn)
    if spec.context_window_mode == "single_turn":
        earlier = [(j + 1, shown[j][0], record.turns[j].response, record.turns[j].reward) for j in range(first, turn)]
        user = first_user_message(*rules, history_block(earlier) + turn_message(turn + 1, *shown[turn], think))
        messages = [{"role": "user", "content": user}]
    else:
        messages = [
            {"role": "user", "content": first_user_message(*rules, turn_message(first + 1, *shown[first], think))}
        ]
        for j in range(first, turn):
            messages.append({"role": "assistant", "content": reply_texts[j]})
            text = turn_message(j + 2, *shown[j + 1], think, reward=record.turns[j].reward)
            messages.append({"role": "user", "content": text})
    messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _check_windows(tokenizer, spec, records, sampled_prompts):
    stop = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    for index, record in enumerate(records):
        segments = _segments(record)
        assert len(segments) == len(record.turns) > 0
        replies = [reply[:-1] if reply[-1] in stop else reply for _, reply in segments]
        reply_texts = [tokenizer.decode(reply) for reply in replies]
        for turn, (prompt, _) in enumerate(segments):
            assert prompt == sampled_prompts[turn][_active_row(records, turn, index)]  # what the sampler saw
            assert tokenizer.decode(prompt) == _expected_text(tokenizer, spec, record, turn, reply_texts)


def _active_row(records, turn, index):
    """Row of trajectory ``index`` in the backend call of ``turn`` (finished trajectories drop out)."""
    return sum(1 for r in records[:index] if len(r.turns) > turn)


@pytest.mark.parametrize("window", [1, 2])
def test_limited_window_prompts_with_the_tiny_model(tiny_policy, window):
    model, tokenizer = tiny_policy
    spec = _spec("frozen_lake", "limited_multi_turn", window)
    backend = Recording(HFBackend(model, tokenizer, temperature=1.0, max_new_tokens=12))
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=3)
    assert max(len(r.turns) for r in records) == MAX_TURNS  # random replies rarely end an episode early
    _check_windows(tokenizer, spec, records, backend.prompts)
    if window == 1:  # each prompt is the system message and one user message, whatever came before
        for record in records:
            for prompt, _ in _segments(record):
                assert tokenizer.decode(prompt).count("<|im_start|>") == 3


@pytest.mark.parametrize(("mode", "window"), [("limited_multi_turn", 2), ("single_turn", 1), ("single_turn", 3)])
def test_windows_over_valid_moves(tiny_policy, mode, window):
    # scripted replies take valid random moves, so the states inside a window really differ from turn to turn
    _, tokenizer = tiny_policy
    spec = _spec("sokoban", mode, window, actions_per_turn=2)
    backend = Recording(ScriptedBackend("random", tokenizer))
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=9)
    assert any(len({s for s, _ in _replay(spec, r)[1]}) > 2 for r in records), "the moves should change the state"
    _check_windows(tokenizer, spec, records, backend.prompts)
    assert all(r.behavior_logprobs is None for r in records)


def test_a_window_covering_every_turn_reproduces_the_full_chat(tiny_policy):
    _, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    windowed = run_rollouts(
        _spec("sokoban", "limited_multi_turn", MAX_TURNS), ScriptedBackend("random", tokenizer), formatter, seed=2
    )
    full = run_rollouts(_spec("sokoban", "full", None), ScriptedBackend("random", tokenizer), formatter, seed=2)
    for w, f in zip(windowed, full, strict=True):
        assert f.segment_lengths is None and len(w.segment_lengths) == len(w.turns)
        last_prompt, last_reply = _segments(w)[-1]
        assert last_prompt + last_reply == f.input_ids  # the last window is the whole chat, token for token
        assert [t.observation for t in w.turns] == [t.observation for t in f.turns]


def test_windowed_rows_rescore_to_the_behaviour_logprobs_one_sequence_at_a_time(tiny_policy):
    # independent of the packed batch: each turn's sequence alone through the model gives the sampler's log-probs
    model, tokenizer = tiny_policy
    spec = _spec("frozen_lake", "single_turn", 2)
    record = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 12), ChatFormatter(tokenizer), seed=4)[0]
    start = 0
    for length in record.segment_lengths:
        ids = torch.tensor([record.input_ids[start : start + length]])
        mask = torch.tensor(record.loss_mask[start + 1 : start + length], dtype=torch.bool)
        stored = torch.tensor(record.behavior_logprobs[start + 1 : start + length])
        with torch.no_grad():
            logits = model.eval()(input_ids=ids).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(1, ids[0, 1:, None]).squeeze(1)
        assert float((logprobs[mask] - stored[mask]).abs().max()) < 1e-4
        start += length
