"""Tool calls in the model's own chat format: reading them out of a reply, and writing them (scripted replies).

A model trained on a chat template calls tools in that template's format; a parser reads that format, registered by
name (``rollout.tool_parser``): ``hermes``, the format of Hermes and Qwen2.5 (and vLLM's ``hermes`` parser), one
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block per call; ``llama3_json``, Llama 3.1's bare JSON
object ``{"name": ..., "parameters": {...}}``, one per line. An unknown name is refused listing the registered
ones. Each parser reads a reply into its thinking, its calls (each parsed, or why it is not: bad JSON, no name)
and whether the reply has the format: under the strict reading (``rollout.reply_format``) a reply is only its
thinking (when replies think) and its calls, and it ended; the lenient one finds the calls anywhere.

A call does not parse (``bad_json``, the agent's error, never an exception) when it is not JSON, is longer than
:data:`MAX_CALL_CHARS` characters, nests objects and arrays deeper than :data:`MAX_DEPTH` levels, or holds text that
is not valid UTF-8 (a lone surrogate such as ``"\\ud800"``, which no table can store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ragen_core.registry import Registry

_THINK = re.compile(r"^\s*<think>(.*?)</think>", re.DOTALL)
MAX_CALL_CHARS = 100_000  # one call's JSON: far over any reply's; bounds the work on text from outside (served envs)
MAX_DEPTH = 32  # levels of objects and arrays in one call (the call's object is 1, its arguments 2)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]

    def text(self) -> str:
        """The call as one canonical line of JSON (the turn's ``actions`` entry; :meth:`from_text` reads it)."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)

    @classmethod
    def from_text(cls, text: str) -> ToolCall:
        """The call of a :meth:`text` line; a ValueError of one line for anything else."""
        call, problem = read_call(text)
        if call is None:
            raise ValueError(f"not a tool call: {problem}")
        return call


@dataclass(frozen=True)
class CallBlock:
    """One call as the reply wrote it: its text, and the call it parses to, or why it does not (``error`` is
    ``bad_json``, and ``detail`` says what)."""

    raw: str
    call: ToolCall | None
    error: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class ToolReply:
    """A reply read by a tool-call parser: its thinking, its calls in order, its text outside both (``content``),
    and whether it has the format (``format_ok``)."""

    think: str
    blocks: list[CallBlock] = field(default_factory=list)
    content: str = ""
    format_ok: bool = False


def read_call(text: str, arguments_key: str = "arguments") -> tuple[ToolCall | None, str]:
    """A call written as JSON, ``{"name": ..., "<arguments_key>": {...}}``, or None and what is wrong with it (in
    one line; the module docstring says what does not parse)."""
    if len(text) > MAX_CALL_CHARS:
        return None, f"longer than {MAX_CALL_CHARS:,} characters"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at character {exc.pos})"
    except RecursionError:
        return None, f"not valid JSON (nested deeper than {MAX_DEPTH} levels)"
    except ValueError as exc:  # an integer of more digits than int() converts
        return None, f"not valid JSON ({str(exc).split(':')[0][:100]})"
    problem = _unstorable(value)
    if problem:
        return None, problem
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None, 'not an object with a "name" string'
    arguments = value.get(arguments_key, {})
    if not isinstance(arguments, dict):
        return None, f'"{arguments_key}" is not a JSON object'
    extra = sorted(set(value) - {"name", arguments_key})
    if extra:
        return None, f"unexpected key(s) {', '.join(extra)} beside name and {arguments_key}"
    return ToolCall(value["name"], arguments), ""


def _unstorable(value: Any) -> str:
    """Why a parsed call cannot be kept (nested deeper than :data:`MAX_DEPTH`, or text that is not valid UTF-8: a
    lone surrogate), or ""."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            stack += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds text that is not valid UTF-8 (the lone surrogate \\u{ord(exc.object[exc.start]):04x})"
    return ""


class ToolParser(Protocol):
    """Reads a reply's tool calls in one chat format (:meth:`read`) and writes calls in it (:meth:`write`)."""

    def read(self, text: str, enable_think: bool, strict: bool, finished: bool) -> ToolReply:
        """The reply ``text`` read: its thinking (when ``enable_think``), its calls and whether it has the format
        (``strict``: nothing but them, and the reply ``finished`` with its stop token)."""
        ...

    def write(self, calls: list[ToolCall], think: str | None) -> str:
        """A reply making ``calls`` in this format, after ``think`` in a think block when given."""
        ...


TOOL_PARSERS: Registry[Callable[[], ToolParser]] = Registry("tool-call parser")


def register_tool_parser(name: str) -> Callable[[Callable[[], ToolParser]], Callable[[], ToolParser]]:
    """Register a parser class (built without arguments) as ``name``."""
    return TOOL_PARSERS.register(name)


def tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name``; a ValueError listing the registered ones for any other."""
    return TOOL_PARSERS.get(name)()


def _split_think(text: str, enable_think: bool) -> tuple[str, str, bool]:
    """(thinking, the rest, whether a think block opens the reply); without thinking the whole text is the rest."""
    if not enable_think:
        return "", text, True
    match = _THINK.match(text)
    if match is None:
        return "", text, False
    return match.group(1).strip(), text[match.end() :], True


def _thinking(think: str | None) -> str:
    return "" if think is None else f"<think>{think}</think>\n"


@register_tool_parser("hermes")
class HermesParser:
    """Hermes / Qwen2.5: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` per call."""

    pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def read(self, text: str, enable_think: bool, strict: bool, finished: bool) -> ToolReply:
        """The reply's thinking, calls and format (module docstring); an unclosed ``<tool_call>`` is a call that
        does not parse."""
        think, rest, opened = _split_think(text, enable_think)
        blocks, outside, end = [], [], 0
        for match in self.pattern.finditer(rest):
            outside.append(rest[end : match.start()])
            call, problem = read_call(match.group(1).strip())
            blocks.append(CallBlock(match.group(1), call, None if call else "bad_json", problem))
            end = match.end()
        tail = rest[end:]
        if "<tool_call>" in tail:  # cut before its closing tag
            cut = tail[tail.index("<tool_call>") + len("<tool_call>") :]
            blocks.append(CallBlock(cut, None, "bad_json", "the <tool_call> block is not closed"))
            tail = tail[: tail.index("<tool_call>")]
        content = "".join([*outside, tail]).strip()
        format_ok = bool(blocks) and (not strict or (opened and finished and not content))
        return ToolReply(think, blocks, content, format_ok)

    def write(self, calls: list[ToolCall], think: str | None) -> str:
        """The calls as Qwen2.5's template renders an assistant's ``tool_calls`` (after its header)."""
        return _thinking(think) + "\n".join(f"<tool_call>\n{call.text()}\n</tool_call>" for call in calls)


@register_tool_parser("llama3_json")
class Llama3JsonParser:
    """Llama 3.1's JSON calls: ``{"name": ..., "parameters": {...}}``, one object per line (vLLM's
    ``llama3_json``)."""

    def read(self, text: str, enable_think: bool, strict: bool, finished: bool) -> ToolReply:
        """Every line of the reply (after its thinking) that opens with ``{`` is a call; other text is content."""
        think, rest, opened = _split_think(text, enable_think)
        blocks, outside = [], []
        for line in rest.splitlines():
            if line.strip().startswith("{"):
                call, problem = read_call(line.strip(), "parameters")
                blocks.append(CallBlock(line.strip(), call, None if call else "bad_json", problem))
            else:
                outside.append(line)
        content = "\n".join(outside).strip()
        format_ok = bool(blocks) and (not strict or (opened and finished and not content))
        return ToolReply(think, blocks, content, format_ok)

    def write(self, calls: list[ToolCall], think: str | None) -> str:
        """One JSON object per call, with Llama's ``parameters`` key."""
        lines = [json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls]
        return _thinking(think) + "\n".join(lines)


__all__ = [
    "MAX_CALL_CHARS",
    "MAX_DEPTH",
    "TOOL_PARSERS",
    "CallBlock",
    "HermesParser",
    "Llama3JsonParser",
    "ToolCall",
    "ToolParser",
    "ToolReply",
    "read_call",
    "register_tool_parser",
    "tool_parser",
]
