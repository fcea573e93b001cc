"""Parsing model replies into actions, and the format penalty.

RAGEN's reply format: ``<think>...</think><answer>...</answer>``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

ACTION_SEPARATOR = "||"
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_ONLY = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class ParsedResponse:
    """A reply split into its parts.

    ``actions`` are the canonical names of the valid actions, in order, after truncation to ``max_actions``;
    ``invalid_actions`` the answer items that named no action. ``format_ok`` is False when the tags do not parse.
    """

    think: str
    answer: str
    actions: list[str] = field(default_factory=list)
    invalid_actions: list[str] = field(default_factory=list)
    format_ok: bool = False

    @property
    def valid(self) -> bool:
        """The reply parsed, named at least one action, and every named action was valid."""
        return self.format_ok and bool(self.actions) and not self.invalid_actions


def parse_response(
    text: str,
    actions: list[str] | Callable[[str], str | None],
    max_actions: int,
    enable_think: bool = True,
) -> ParsedResponse:
    """Parse ``<think>..</think><answer>..</answer>`` (only ``<answer>`` when thinking is disabled).

    Text around the tags is tolerated (as in RAGEN's ``re.search``). Answer items are split on ``||``, stripped,
    truncated to ``max_actions`` and matched to the env's actions: ``actions`` is either the list of action names
    (matched case-insensitively) or the env's ``parse_action`` (item -> canonical action or None).
    """
    match = (_THINK_ANSWER if enable_think else _ANSWER_ONLY).search(text)
    if match is None:
        return ParsedResponse(think="", answer="", format_ok=False)
    think = match.group(1).strip() if enable_think else ""
    answer = match.group(2 if enable_think else 1).strip()
    if "<think>" in think or "<answer>" in answer or "<think>" in answer:
        return ParsedResponse(think=think, answer=answer, format_ok=False)
    items = [item.strip() for item in answer.split(ACTION_SEPARATOR) if item.strip()][:max_actions]
    if callable(actions):
        match_action = actions
    else:
        lookup = {name.lower(): name for name in actions}
        match_action = lambda item: lookup.get(item.lower())  # noqa: E731
    matched = [(item, match_action(item)) for item in items]
    valid = [action for _, action in matched if action is not None]
    invalid = [item for item, action in matched if action is None]
    return ParsedResponse(think=think, answer=answer, actions=valid, invalid_actions=invalid, format_ok=bool(items))


def turn_penalty(parsed: ParsedResponse, penalty: float) -> float:
    """The format penalty of one turn: ``penalty`` (e.g. -0.1) when the reply is not fully valid, else 0."""
    return 0.0 if parsed.valid else penalty
