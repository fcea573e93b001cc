"""Tools for agents: typed functions as OpenAI function schemas (:mod:`~ragen_core.tools.schema`), tool calls in the
model's chat format read and written by registered parsers (:mod:`~ragen_core.tools.parsers`), and what a call came
to (:mod:`~ragen_core.tools.calls`). It imports only the registry, so the schemas, the envs and the agent may all
use it (docs/environments.md, "Tool environments")."""

from ragen_core.tools.calls import FAILED, MALFORMED, TOOL_ERRORS, CallRecord, ToolResult
from ragen_core.tools.parsers import (
    TOOL_PARSERS,
    CallBlock,
    ToolCall,
    ToolParser,
    ToolReply,
    register_tool_parser,
    tool_parser,
)
from ragen_core.tools.schema import Tool, check_arguments, function_tool

__all__ = [
    "FAILED",
    "MALFORMED",
    "TOOL_ERRORS",
    "TOOL_PARSERS",
    "CallBlock",
    "CallRecord",
    "Tool",
    "ToolCall",
    "ToolParser",
    "ToolReply",
    "ToolResult",
    "check_arguments",
    "function_tool",
    "register_tool_parser",
    "tool_parser",
]
