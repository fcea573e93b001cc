"""A prompt longer than the model's context (issue 66, item 4): an env whose observation is 10 MB (10,485,992 tokens
for a 4,096-token model, then an 11.6 GB update) is refused in one line naming the env, its row and the turn, before
the text is tokenised and before the turn is sampled; a prompt within the context but over it in tokens is refused
by its token count; every prompt that fits is what it was."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.config.loading import build_config
from ragen_core.envs.external import UserCodeError
from ragen_core.rollout import PromptTooLongError, RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.run.session import chat_formatter, prompt_context
from tests.envs.user_code import unique, write_env_module

TEN_MB = 10 * 2**20

HUGE = '''
from {coin} import CoinEnv


class HugeEnv(CoinEnv):
    """Its state is 10 MB of text (after a first normal turn with ``late=True``)."""

    def __init__(self, late=False):
        super().__init__()
        self.late = late

    def render(self):
        return "x" * {size} if (self.done or not self.late) else super().render()

    def step(self, action):
        state, reward, terminated, truncated, info = super().step(action)
        return self.render(), reward, False, truncated, info  # the game goes on, showing the huge state
'''


class CountingTokenizer:
    """The Hugging Face tokenizer, with the length of every text it was asked to encode kept."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer, self.encoded = tokenizer, []

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.encoded.append(len(text))
        return self._tokenizer.encode(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


class CountingBackend(ScriptedBackend):
    """The scripted backend, counting its ``generate`` calls (the turns sampled)."""

    calls = 0

    def generate(self, contexts, seed):
        self.calls += 1
        return super().generate(contexts, seed)


@pytest.fixture
def huge(tmp_path, monkeypatch) -> str:
    coin = write_env_module(tmp_path, unique("coin_envs")).split(":")[0]
    module = unique("huge_envs")
    (tmp_path / f"{module}.py").write_text(HUGE.format(coin=coin, size=TEN_MB))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:HugeEnv"


def test_the_models_context_is_its_max_position_embeddings(tiny_policy):
    model = tiny_policy[0]
    assert prompt_context(build_config(), model) == model.config.max_position_embeddings == 4096
    served = build_config(overrides=["rollout.backend=vllm", "rollout.vllm.max_model_len=1024"])
    assert prompt_context(served, model) == 1024  # the server's own limit, when smaller
    assert chat_formatter(build_config(), tiny_policy[1], 4096).context_tokens == 4096


def test_a_10_mb_observation_is_refused_before_it_is_tokenised_or_sampled(tiny_policy, huge):
    tokenizer = CountingTokenizer(tiny_policy[1])
    formatter = ChatFormatter(tokenizer, context_tokens=4096)
    backend = CountingBackend("expert", tiny_policy[1])
    spec = RolloutSpec(huge, [2, 3], 2, max_turns=2, max_actions_per_turn=1, max_actions_per_traj=2)
    with pytest.raises(PromptTooLongError) as caught:
        run_rollouts(spec, backend, formatter, seed=0)
    per_token = max(len(token) for token in tiny_policy[1].get_vocab())  # the tokenizer's longest token
    said = re.fullmatch(
        rf"the prompt of turn_index 0 \(env {re.escape(huge)}, env_seed 2, group_id 0, traj_index 0\) would be "
        r"([0-9,]+) characters, more than the model's context of 4,096 tokens can hold \(a token of its tokenizer "
        rf"spells at most {per_token} characters\): the env's text is too long for the model; shorten what the env "
        r"renders \(or show fewer turns: env.max_turns, rollout.context_window_mode\)",
        str(caught.value),
    )
    assert said is not None, str(caught.value)
    assert TEN_MB < int(said.group(1).replace(",", "")) < TEN_MB + 2000  # the state and the short chat around it
    assert isinstance(caught.value, UserCodeError)  # the command's one line
    assert backend.calls == 0  # nothing sampled
    assert max(tokenizer.encoded, default=0) < 100_000  # the 10 MB never tokenised


def test_a_10_mb_observation_after_a_step_is_refused_at_its_turn(tiny_policy, huge):
    tokenizer = CountingTokenizer(tiny_policy[1])
    backend = CountingBackend("expert", tiny_policy[1])
    spec = RolloutSpec(huge, [5], 1, 3, 1, 3, env_options={"late": True})
    with pytest.raises(PromptTooLongError, match=r"^the prompt of turn_index 1 \(env .*, env_seed 5, group_id 0, "):
        run_rollouts(spec, backend, ChatFormatter(tokenizer, context_tokens=4096), seed=0)
    assert backend.calls == 1 and max(tokenizer.encoded, default=0) < 100_000  # turn 1 sampled, turn 2 refused before


@pytest.mark.parametrize(("mode", "window"), [("full", None), ("single_turn", 2)])
def test_a_prompt_over_the_context_in_tokens_is_refused_by_its_count(tiny_policy, mode, window):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec("sokoban", [4], 1, 3, 1, 3, context_window_mode=mode, max_context_window=window)
    backend = ScriptedBackend("random", tokenizer)
    (record,) = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=0)  # unlimited: every prompt's length
    assert len(record.turns) >= 2
    limit = record.loss_mask.index(1)  # the first prompt's tokens: it fits, the longer second one does not
    with pytest.raises(PromptTooLongError) as caught:
        run_rollouts(spec, backend, ChatFormatter(tokenizer, context_tokens=limit), seed=0)
    (turn, tokens) = _refused_turn(record, limit, mode)
    assert str(caught.value).startswith(
        f"the prompt of turn_index {turn} (env sokoban, env_seed {record.env_seed}, group_id 0, traj_index 0) is "
        f"{tokens:,} tokens, longer than the model's context of {limit:,} tokens: the env's text is too long"
    )


def _refused_turn(record, limit: int, mode: str) -> tuple[int, int]:
    """The first turn whose prompt (what precedes its reply in the row; windowed: in its own segment) is longer than
    ``limit`` tokens, and that length, read from the unlimited rollout's row."""
    replies = []
    segments = record.segment_lengths or [len(record.input_ids)]
    starts = [sum(segments[:i]) for i in range(len(segments))]
    for index, mask in enumerate(record.loss_mask):
        if mask and (index == 0 or not record.loss_mask[index - 1]):
            replies.append(index)
    for turn, reply_start in enumerate(replies):
        position = starts[turn] if mode != "full" else 0
        if reply_start - position > limit:
            return turn, reply_start - position
    raise AssertionError("no prompt is over the limit")


@pytest.mark.parametrize("env", ["sokoban", "frozen_lake", "sudoku"])
def test_prompts_within_the_context_are_unchanged(tiny_policy, env):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec(env, [1, 2], 2, 4, 2, 8)
    backend = ScriptedBackend("random", tokenizer)
    free = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=3)
    limited = run_rollouts(spec, backend, ChatFormatter(tokenizer, context_tokens=4096), seed=3)
    assert [r.input_ids for r in limited] == [r.input_ids for r in free]
    assert [[t.observation for t in r.turns] for r in limited] == [[t.observation for t in r.turns] for r in free]
