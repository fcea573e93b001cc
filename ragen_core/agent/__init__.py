"""Prompt building and reply parsing."""

from ragen_core.agent.parsing import ACTION_SEPARATOR, ParsedResponse, parse_response, turn_penalty
from ragen_core.agent.prompts import ChatFormatter, first_user_message, history_block, reply_prefix, turn_message

__all__ = [
    "ACTION_SEPARATOR",
    "ChatFormatter",
    "ParsedResponse",
    "first_user_message",
    "history_block",
    "parse_response",
    "reply_prefix",
    "turn_message",
    "turn_penalty",
]
