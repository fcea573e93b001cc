"""The turns of a tool env's rollouts (:class:`~ragen_core.envs.tool_env.ToolEnv`): prompts and replies.

The engine (:mod:`ragen_core.rollout.engine`) rolls a tool env out as any other, and asks this module for what
differs: each turn's prompt, token-exact through :class:`~ragen_core.agent.tool_chat.ToolChat` (turn 1 rendered with
the tools, each later turn the delta of the env's messages appended to the ids the model saw, its replies as
sampled), and what a reply does: its calls read in the model's chat format (``rollout.tool_parser``), each run by
the env under ``env.tool_timeout_s`` (:meth:`ToolEnv.call`) within the turn's budget, each told back to the agent as
a ``tool`` message and kept as a :class:`~ragen_core.tools.CallRecord`. A call that does not parse, names no tool or
does not fit its schema makes the reply invalid (the format penalty, RAGEN's for a reply without a valid action);
a reply that calls no tool is told so in a ``user`` message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen_core.agent import ChatFormatter, ParsedResponse
from ragen_core.agent.tool_chat import Message, ToolChat
from ragen_core.envs.external import UserCodeError, one_line, shown
from ragen_core.envs.tool_env import ToolEnv, is_tool_env
from ragen_core.envs.watchdog import Watchdog
from ragen_core.rollout.types import TrajectoryRecord, TurnOutcome
from ragen_core.tools import CallBlock, CallRecord, ToolCall, ToolParser, ToolReply, tool_parser

NO_CALL = "error: the reply called no tool; reply with tool calls only, as: {example}"
BROKEN = "error: the reply must hold only tool calls{think}, as: {example}; none was run"


@dataclass
class ToolSlot:
    """One trajectory's chat: its messages so far, the text the model has seen (its prompts and its replies), the
    last reply as it will stand in the chat, and the env's messages waiting to open the next turn."""

    messages: list[Message] = field(default_factory=list)
    seen: str = ""
    reply: str = ""
    pending: list[Message] = field(default_factory=list)


@dataclass
class ToolTurns:
    """What a rollout's tool turns share: the chat (the formatter and the env's tool schemas), the parser of the
    model's call format, the watchdog the tools run under, and the ids of texts already encoded."""

    chat: ToolChat
    parser: ToolParser
    watchdog: Watchdog
    encoded: dict[str, list[int]] = field(default_factory=dict)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (encoding is a pure function of it: each distinct text is encoded once)."""
        ids = self.encoded.get(text)
        if ids is None:
            ids = self.encoded[text] = self.chat.formatter.encode(text)
        return ids

    def prompt(
        self, slot: ToolSlot, record: TrajectoryRecord, first_message: str | None, limit: int | None
    ) -> tuple[list[int], str]:
        """Append this turn's text to the trajectory's sequence (mask 0): turn 1's whole prompt (for
        ``first_message``) or the delta of the env's pending messages; return the sequence and the turn's
        observation. A sequence of more than ``limit`` tokens is returned unstored, for the caller to refuse."""
        text, observation = self.prompt_text(slot, first_message)
        ids = self.encode(text)
        if limit is not None and len(record.input_ids) + len(ids) > limit:
            return record.input_ids + ids, observation
        record.add_context(ids)
        return record.input_ids, observation

    def prompt_text(self, slot: ToolSlot, first_message: str | None) -> tuple[str, str]:
        """The text this turn adds to the sequence and the turn's ``observation``: turn 1's whole prompt (for
        ``first_message``), else the delta of the env's pending messages; the slot's chat moves on by it."""
        if first_message is not None:
            slot.messages, text = self.chat.start(first_message)
            slot.seen = text
            return text, first_message
        text = self.chat.delta(slot.messages, slot.reply, slot.seen, slot.pending)
        slot.messages = [*slot.messages, {"role": "assistant", "content": slot.reply}, *slot.pending]
        observation = "\n".join(message["content"] for message in slot.pending)
        slot.seen, slot.pending = slot.seen + text, []
        return text, observation


def open_tool_turns(env: object, formatter: ChatFormatter, spec: Any, watchdog: Watchdog) -> ToolTurns | None:
    """What a rollout's tool turns share when it plays a tool env (None for any other env): the chat over the env's
    tool schemas, the parser of ``spec.tool_parser``, the watchdog of its tools. A tool env is played in full context
    mode only (a window would re-render the chat: the replies' tokens would no longer be the sampled ones)."""
    if not is_tool_env(env):
        return None
    if spec.context_window_mode != "full":
        raise ValueError(
            f"{spec.env_name} is a tool env, played with its whole chat: set rollout.context_window_mode=full (a "
            f"window, {spec.context_window_mode}, would re-render the chat instead of the sampled tokens)"
        )
    return ToolTurns(ToolChat(formatter, env.tool_schemas()), tool_parser(spec.tool_parser), watchdog)


def read_reply(
    turns: ToolTurns, env: ToolEnv, reply: str, enable_think: bool, strict: bool, finished: bool
) -> tuple[ToolReply, ParsedResponse]:
    """The reply read by the parser, and as a :class:`ParsedResponse`: its calls that can run as actions, the ones
    that cannot (bad JSON, an unknown tool, arguments that do not fit) as invalid ones."""
    read = turns.parser.read(reply, enable_think, strict, finished)
    if not read.format_ok:
        return read, ParsedResponse(think=read.think, answer=read.content, format_ok=False)
    runnable = [b.call.text() for b in read.blocks if b.call is not None and env.malformed(b.call) is None]
    invalid = [b.raw for b in read.blocks if b.call is None or env.malformed(b.call) is not None]
    return read, ParsedResponse(read.think, read.content, runnable, invalid, format_ok=True)


def run_calls(turns: ToolTurns, env: ToolEnv, read: ToolReply, parsed: ParsedResponse, budget: int) -> TurnOutcome:
    """Run the reply's calls in order: a malformed one is told its error, a call past ``budget`` or after the episode
    ended is not run; each call's message waits in the outcome's records (:func:`next_messages`). A reply that broke
    the format runs none: its calls are recorded as not run (or as not parsing)."""
    outcome = TurnOutcome(parsed, calls_read=len(read.blocks))
    if not parsed.format_ok:  # none runs; each is kept, so the turn's tool_calls hold every call the reply wrote
        outcome.records += [_in_broken_reply(block) for block in read.blocks]
        return outcome
    for block in read.blocks:
        record = _unrunnable(env, block)
        if record is None and (len(outcome.executed) >= budget or outcome.terminated or outcome.truncated):
            record = CallRecord.of(block.call, _not_run(budget, outcome), "not_run")
        if record is not None:
            outcome.records.append(record)
            continue
        state, reward, terminated, truncated, info = _call(env, block.call, turns.watchdog)
        outcome.state, outcome.reward = state, outcome.reward + reward
        outcome.terminated, outcome.truncated = terminated, truncated
        outcome.executed.append(block.call.text())
        outcome.infos.append(info)
        outcome.records.append(CallRecord(**info["tool_call"]))
    return outcome


def next_messages(turns: ToolTurns, outcome: TurnOutcome, enable_think: bool) -> list[Message]:
    """The env's messages that open the next turn: one ``tool`` message per call (its result or error) of a reply
    with the format, or one ``user`` message saying what was wrong when no call was read or the reply broke it."""
    if outcome.records and outcome.parsed.format_ok:
        return [{"role": "tool", "content": record.result} for record in outcome.records]
    example = turns.parser.write([ToolCall("name", {"argument": "value"})], None)
    if not outcome.calls_read:
        return [{"role": "user", "content": NO_CALL.format(example=example)}]
    think = " (after your thinking in <think></think>)" if enable_think else ""
    return [{"role": "user", "content": BROKEN.format(think=think, example=example)}]


def _call(env: ToolEnv, call: ToolCall, watchdog: Watchdog) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """``env.call``: what its tool raises is the agent's to read (:meth:`ToolEnv.call`); what the env's own code
    raises around it (its ``render``, say) stops the run in one line (:class:`UserCodeError`), as a failing step."""
    try:
        return env.call(call, watchdog)
    except Exception as exc:
        where = f"environment {type(env).__module__}:{type(env).__qualname__}.call({shown(call.text(), 60)})"
        raise UserCodeError(f"{where} raised {one_line(exc)}") from exc


def _unrunnable(env: ToolEnv, block: CallBlock) -> CallRecord | None:
    """The record of a call that cannot run (it does not parse, names no tool or does not fit its schema)."""
    if block.call is None:
        return CallRecord(None, block.raw, f"error: the tool call does not parse: {block.detail}", "bad_json")
    return env.malformed(block.call)


def _in_broken_reply(block: CallBlock) -> CallRecord:
    """The record of a call in a reply that broke the format: not run (or, when it does not parse, ``bad_json``)."""
    if block.call is None:
        return CallRecord(None, block.raw, f"error: the tool call does not parse: {block.detail}", "bad_json")
    return CallRecord.of(block.call, "error: not run: the reply broke the format", "not_run")


def _not_run(budget: int, outcome: TurnOutcome) -> str:
    if outcome.terminated or outcome.truncated:
        return "error: not run: the episode had ended"
    return f"error: not run: at most {budget} tool call(s) in this reply"


__all__ = ["ToolSlot", "ToolTurns", "next_messages", "open_tool_turns", "read_reply", "run_calls"]
