"""Parsing model replies into actions, and the format penalty.

RAGEN's reply format: ``<think>...</think><answer>...</answer>``.

Two readings of a reply (``rollout.reply_format``):

- ``strict`` (the default): the reply must *be* the format, anchored at both ends (only whitespace around it), and it
  must have ended: a reply cut at the token limit (``finished=False``) is a format error whatever it holds. RAGEN
  finds the tags anywhere (``re.search``) but then trains on a rewritten reply,
  ``<think>..</think><answer>..</answer>`` closed by the chat template's end token, so what follows ``</answer>`` is
  never learned. This project trains on
  the tokens it sampled (token-exact, with the sampler's log-probs), so a tolerated tail *would* be learned: a reply
  that answers and then runs on to the limit earned full reward, and the policy unlearned its end token (the demo's
  replies were 99% truncated by iteration 25). Refusing the tail gives such replies a lower reward than the ones that
  end, which is the incentive RAGEN's rewrite gives.
- ``lenient``: RAGEN's search, text around the tags tolerated, truncation ignored (runs stored before the strict
  reading behaved so).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

ACTION_SEPARATOR = "||"
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_ONLY = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
REPLY_FORMATS = ("strict", "lenient")


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
    reply_format: str = "strict",
    finished: bool = True,
) -> ParsedResponse:
    """Parse ``<think>..</think><answer>..</answer>`` (only ``<answer>`` when thinking is disabled).

    ``reply_format='strict'``: the tags must span the whole reply (whitespace aside) and the reply must have ended
    (``finished``: the sampler emitted a stop token before the length limit); otherwise the reply is a format error
    (its think and answer are still returned, for the diagnostics, but no action). ``'lenient'``: text around the tags
    is tolerated and ``finished`` ignored (RAGEN's ``re.search``). Answer items are split on ``||``, stripped,
    truncated to ``max_actions`` and matched to the env's actions: ``actions`` is either the list of action names
    (matched case-insensitively) or the env's ``parse_action`` (item -> canonical action or None).
    """
    if reply_format not in REPLY_FORMATS:
        raise ValueError(f"unknown reply format {reply_format!r}; use one of {', '.join(REPLY_FORMATS)}")
    match = (_THINK_ANSWER if enable_think else _ANSWER_ONLY).search(text)
    if match is None:
        return ParsedResponse(think="", answer="", format_ok=False)
    think = match.group(1).strip() if enable_think else ""
    answer = match.group(2 if enable_think else 1).strip()
    if "<think>" in think or "<answer>" in answer or "<think>" in answer:
        return ParsedResponse(think=think, answer=answer, format_ok=False)
    if reply_format == "strict" and (not finished or text[: match.start()].strip() or text[match.end() :].strip()):
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
