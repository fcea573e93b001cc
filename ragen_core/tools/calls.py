"""What one tool call came to: the text the agent is told, its reward and end, and the record a turn keeps of it.

The ``turns`` table keeps every call of a reply as a record (:class:`CallRecord`: the tool's name, its arguments as
JSON, the result the agent was told, the error, the seconds it ran), so which tool fails, how and when is one SQL
query. Errors are of two kinds: the agent's (:data:`MALFORMED`: a call that does not parse, names no tool or does
not fit its schema), a format error that draws the format penalty; and the tool's (:data:`FAILED`: it raised, or
ran past ``env.tool_timeout_s``), which the agent is told and the run records as an ``events`` row, never a failed
or hung run. A record's text is valid UTF-8, as the table stores it: text a tool or its error wrote that is not (a
lone surrogate, as a file name read with ``surrogateescape`` holds) is kept and told with backslash escapes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from schemas.tables import TOOL_ERRORS  # the turns' error vocabulary: the column's contract owns it

MALFORMED = ("bad_json", "unknown_tool", "bad_arguments")  # the agent's errors: the reply is not valid
FAILED = ("raised", "timeout")  # the tool's failures: told to the agent, an events row of the run


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns when it does more than answer: its text for the agent, the reward it earns (finite) and
    whether it ends the episode (a final answer). A tool returning anything else returns ``str(value)``."""

    text: str
    reward: float = 0.0
    done: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"a ToolResult's text is a string, got {type(self.text).__name__}")
        if isinstance(self.reward, bool) or not isinstance(self.reward, int | float) or not math.isfinite(self.reward):
            raise TypeError(f"a ToolResult's reward is a finite number, got {self.reward!r}")

    @classmethod
    def of(cls, value: Any) -> ToolResult:
        """``value`` when it is a ToolResult, else its text (``str(value)``)."""
        return value if isinstance(value, ToolResult) else cls(str(value))


@dataclass(frozen=True)
class CallRecord:
    """One call of a reply as the ``turns`` table's ``tool_calls`` keeps it: the tool's name (None when the call did
    not parse), its arguments as JSON (the call's text when it did not parse), the text the agent was told (the
    tool's result, or the error), the error (a key of :data:`TOOL_ERRORS`, None when it ran well) and the wall-clock
    seconds the tool ran (0 when it did not run). Text that is not valid UTF-8 is escaped (module docstring)."""

    name: str | None
    arguments: str
    result: str
    error: str | None = None
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.error is not None and self.error not in TOOL_ERRORS:
            raise ValueError(f"unknown tool error {self.error!r}; errors: {', '.join(TOOL_ERRORS)}")
        for key in ("name", "arguments", "result"):
            object.__setattr__(self, key, storable(getattr(self, key)))

    @classmethod
    def of(cls, call: Any, result: str, error: str | None = None, duration_s: float = 0.0) -> CallRecord:
        """The record of a parsed :class:`~ragen_core.tools.parsers.ToolCall` (its arguments written as JSON)."""
        return cls(call.name, json.dumps(call.arguments, ensure_ascii=False), result, error, duration_s)

    def row(self) -> dict[str, Any]:
        """The record as the column's struct."""
        return asdict(self)


def storable(text: str | None) -> str | None:
    """``text`` when it is valid UTF-8 (as every string a table stores must be), else with each character that is
    not (a lone surrogate) written as its backslash escape (``\\udcff``)."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


__all__ = ["FAILED", "MALFORMED", "TOOL_ERRORS", "CallRecord", "ToolResult", "storable"]
