"""The chat of a tool env's rollout, token-exact: the first prompt rendered with the tools, each later turn appended.

Turn 1's prompt is the model's chat template rendered over the system message (the ``full`` prompt style's), the
first user message (the env's rules and its question) and ``tools=`` (the env's function schemas), then the reply
prefix. After a reply the env's messages (``role: "tool"``, one per call: its result or its error; a ``user``
message when the reply called no tool) are appended as the *delta* the template renders for them: the chat with
them rendered, minus the text the model has already seen (its prompts and its replies, as sampled). That text must
be a prefix of the new rendering, or the template rewrites what the model saw (a template that drops earlier
thinking, say), and a rollout would train on a chat no prompt showed: such a template is refused in one line. So the
next prompt is the previous ids, the reply's sampled ids and the delta's ids, never a re-tokenised chat.
"""

from __future__ import annotations

from typing import Any

from ragen_core.agent.prompts import ChatFormatter

Message = dict[str, str]


class TemplateError(ValueError):
    """A chat template that cannot carry a tool env's chat token-exactly (one line: which, and why)."""


def first_tool_message(instruction: str, state: str, max_calls: int) -> str:
    """The first user message of a tool env: its rules, the per-reply call limit when above one, its question."""
    limit = f"Up to {max_calls} tool calls per reply.\n" if max_calls > 1 else ""
    return f"{instruction}\n{limit}{state}"


class ToolChat:
    """The token-exact chat of one tool env's rollouts (module docstring), over a :class:`ChatFormatter`'s
    tokenizer, template, system message, reply prefix and length checks, with the env's ``tools`` (function
    schemas)."""

    def __init__(self, formatter: ChatFormatter, tools: list[dict[str, Any]]) -> None:
        self.formatter = formatter
        self.tools = tools
        self._eos_text = formatter.eos_text
        self._probed = False  # whether the template was shown to append a turn without rewriting (start)

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        formatter = self.formatter
        return formatter.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            chat_template=formatter.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def start(self, user_text: str) -> tuple[list[Message], str]:
        """The chat's first messages and the text of turn 1's prompt (the reply prefix included); a template that
        leaves a tool's name out of it (one that ignores ``tools=``), or that rewrites the prompt when a reply and a
        tool message follow it (:meth:`delta`, probed once per chat), is a :class:`TemplateError`."""
        messages = self.formatter.system_messages() + [{"role": "user", "content": user_text}]
        text = self._render(messages, add_generation_prompt=True)
        missing = [t["function"]["name"] for t in self.tools if t["function"]["name"] not in text]
        if missing:
            raise TemplateError(
                f"the model's chat template does not render the tools (no {missing[0]!r} in the prompt): give a "
                "model whose template takes tools= (Qwen2.5's, the tiny default's)"
            )
        prompt = text + self.formatter.reply_prefix
        if not self._probed:  # refused before the first reply is sampled, not after it
            reply = f"{self.formatter.reply_prefix}<think>probe</think>probe"
            seen = self.seen_after(prompt, reply[len(self.formatter.reply_prefix) :], finished=True)
            self.delta(messages, reply, seen, [{"role": "tool", "content": "probe"}])
            self._probed = True
        return messages, prompt

    def seen_after(self, seen: str, generated: str, finished: bool) -> str:
        """The text the model has seen once it replied: ``seen`` (its prompt), the generated text and, when the
        reply ended with its stop token, that token's text."""
        return seen + generated + (self._eos_text if finished and self._eos_text else "")

    def delta(self, messages: list[Message], reply: str, seen: str, new: list[Message]) -> str:
        """The text that appends ``new`` after the assistant's ``reply`` (the chat so far is ``messages`` then the
        reply), up to the next reply prefix: the chat rendered with ``new`` minus ``seen`` (:meth:`seen_after`), which
        must be its prefix (a :class:`TemplateError` otherwise)."""
        chat = [*messages, {"role": "assistant", "content": reply}, *new]
        rendered = self._render(chat, add_generation_prompt=True)
        if not rendered.startswith(seen):
            at = next((i for i, (a, b) in enumerate(zip(seen, rendered, strict=False)) if a != b), len(rendered))
            raise TemplateError(
                "the model's chat template is not prefix-preserving: rendering the chat with the turn's new messages "
                f"changes what the model already saw (at character {at}: {seen[at : at + 24]!r} became "
                f"{rendered[at : at + 24]!r}); token-exact tool use needs a template that only appends (ChatML, "
                "Qwen2.5's)"
            )
        return rendered[len(seen) :] + self.formatter.reply_prefix


__all__ = ["TemplateError", "ToolChat", "first_tool_message"]
