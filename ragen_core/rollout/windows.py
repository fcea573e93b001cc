"""Windowed context modes (RAGEN-2's ``context_window_mode``): what the model sees at each turn, as token ids.

- ``full`` (the engine's own incremental path): the whole chat so far.
- ``limited_multi_turn`` with a window of k turns: the system message, then the turns ``t-k+1 .. t`` as chat turns.
  The oldest turn of the window opens the first user message (rules, actions and that turn's state, without the
  reward of the turn before it, which is outside the window); each later turn is the stored reply ids of the turn
  before it, then that turn's environment text (previous reward, state, budget) exactly as in full mode. With
  ``k >= t + 1`` this is exactly the full-mode prompt.
- ``single_turn`` with a window of k turns: one user message holding the rules, the last ``k - 1`` turns as text
  (state, reply text, reward) and the current turn's state.

Nothing the model produced is re-tokenised in ``limited_multi_turn`` (replies enter the window as their sampled
ids); ``single_turn`` quotes earlier replies as text inside a user message, which is then tokenised like any prompt.
The prompt ids returned are what the backend samples from, and what the engine stores in front of the reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragen_core.agent import ChatFormatter, first_user_message, history_block, rules_text, turn_message

WINDOW_MODES = ("limited_multi_turn", "single_turn")


@dataclass(frozen=True)
class PastTurn:
    """A finished turn, as later windows show it."""

    state: str  # the state the turn's prompt showed
    actions_left: int  # the action budget that prompt showed
    reply_ids: list[int]
    reply_text: str
    reply_finished: bool  # the reply ended with a stop token (else the template's end marker is added after it)
    reward: float  # environment reward the turn's actions collected


class WindowPrompter:
    """Builds the window prompt of one turn; encodings of repeated texts are memoised (group members mostly see
    the same text, and encoding is a pure function of the text)."""

    def __init__(self, formatter: ChatFormatter, mode: str, window: int, max_actions_per_turn: int, think: bool):
        if mode not in WINDOW_MODES:
            raise ValueError(f"unknown windowed context mode {mode!r}; use one of {', '.join(WINDOW_MODES)}")
        if window < 1:
            raise ValueError(f"a context window holds at least the current turn, got {window}")
        self.formatter, self.mode, self.window = formatter, mode, window
        self.max_actions_per_turn, self.think = max_actions_per_turn, think
        self._memo: dict[tuple[str, str, bool], list[int]] = {}

    def _encode(self, kind: str, text: str, finished: bool = True) -> list[int]:
        key = (kind, text, finished)
        ids = self._memo.get(key)
        if ids is None:
            ids = self.formatter.start(text) if kind == "start" else self.formatter.continue_after(text, finished)
            self._memo[key] = ids
        return ids

    def _first(self, env: Any, text: str) -> str:
        style = self.formatter.style
        return first_user_message(rules_text(env, style), env.action_names, self.max_actions_per_turn, text, style)

    def prompt(self, env: Any, past: list[PastTurn], state: str, actions_left: int) -> tuple[list[int], str]:
        """(prompt ids, the user text that ends the prompt) of turn ``len(past)`` showing ``state``."""
        turn = len(past)
        start = max(0, turn - self.window + 1)
        if self.mode == "single_turn":
            shown = [(j + 1, past[j].state, past[j].reply_text, past[j].reward) for j in range(start, turn)]
            current = turn_message(turn + 1, state, actions_left, self.think, style=self.formatter.style)
            text = self._first(env, history_block(shown) + current)
            return list(self._encode("start", text)), text
        views = [(p.state, p.actions_left) for p in past[start:]] + [(state, actions_left)]
        text = self._first(env, turn_message(start + 1, *views[0], self.think, style=self.formatter.style))
        ids = list(self._encode("start", text))
        for j in range(start, turn):
            text = turn_message(j + 2, *views[j + 1 - start], self.think, past[j].reward, self.formatter.style)
            ids += past[j].reply_ids
            ids += self._encode("continue", text, past[j].reply_finished)
        return ids, text
