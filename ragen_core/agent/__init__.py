"""Prompt building and reply parsing."""

from ragen_core.agent.parsing import ACTION_SEPARATOR, ParsedResponse, parse_response, turn_penalty
from ragen_core.agent.prompts import (
    PROMPT_STYLES,
    ChatFormatter,
    PromptTooLong,
    first_user_message,
    history_block,
    reply_prefix,
    rules_text,
    turn_message,
)
from ragen_core.agent.templates import base_chat_template, export_chat_template
from ragen_core.agent.tool_chat import TemplateError, ToolChat, first_tool_message

__all__ = [
    "ACTION_SEPARATOR",
    "PROMPT_STYLES",
    "ChatFormatter",
    "ParsedResponse",
    "PromptTooLong",
    "TemplateError",
    "ToolChat",
    "first_tool_message",
    "first_user_message",
    "history_block",
    "parse_response",
    "reply_prefix",
    "rules_text",
    "turn_message",
    "turn_penalty",
    "base_chat_template",
    "export_chat_template",
]
