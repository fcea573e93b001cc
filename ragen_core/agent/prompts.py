"""Chat prompts for multi-turn rollouts, built as token ids so that history is never re-tokenised.

Turn k+1's prompt is the stored ids of turns 1..k plus the newly tokenised environment text (windowed context modes:
the stored ids of the turns in the window, see :mod:`ragen_core.rollout.windows`). The environment text between two
assistant replies is found by rendering the model's own chat template around a sentinel reply, so any template in
which the reply appears verbatim (ChatML/Qwen, Llama-3, ...) works.
"""

from __future__ import annotations

from typing import Any

from ragen_core.agent.templates import base_chat_template

SYSTEM_PROMPT = "You are a helpful assistant. You think step by step, then act."
THINK_PREFIX = "<think>"
# "full": RAGEN's prompts (system message, rules and legend, the format reminder every turn). "compact": no system
# message, the env's one-line rule (``TextEnv.brief``), the actions, the state and the budget: about a quarter of the
# text, which a small randomly initialised model can learn to read (docs/findings.md, "Multi-turn learning").
PROMPT_STYLES = ("full", "compact")
_SENTINEL = "\u2063RAGEN_SENTINEL\u2063"


def first_user_message(
    instruction: str, action_names: list[str], max_actions_per_turn: int, turn_text: str, style: str = "full"
) -> str:
    """The first user message: rules and legend, the available actions, the per-turn action limit, turn 1.

    Envs with free-form answers (Countdown) have no action names; their instruction says what to answer. The
    ``compact`` style lists the actions shortly and states the per-turn limit only when it is above one.
    """
    if style == "compact":
        actions = f"Actions: {', '.join(action_names)}.\n" if action_names else ""
        limit = ""
        if max_actions_per_turn > 1:
            limit = f"Up to {max_actions_per_turn} actions per turn, separated by ' || '.\n"
        return f"{instruction}\n{actions}{limit}{turn_text}"
    actions_line = f"Your available actions are: {', '.join(action_names)}.\n" if action_names else ""
    return (
        f"{instruction}\n{actions_line}"
        f"You may take up to {max_actions_per_turn} action(s) per turn, separated by ' || '.\n"
        f"{turn_text}"
    )


def turn_message(
    turn: int, state: str, actions_left: int, enable_think: bool, reward: float | None = None, style: str = "full"
) -> str:
    """The user message of turn ``turn`` (1-based): previous reward, the state, the budget and the format reminder
    (``compact``: the previous reward, the state and the budget only)."""
    if style == "compact":
        reward_text = f"Reward: {reward:g}\n" if reward is not None else ""
        return f"{reward_text}State:\n{state}\n{actions_left} actions left."
    reply_format = (
        "<think> [your thoughts] </think> <answer> [your answer] </answer>"
        if enable_think
        else "<answer> [your answer] </answer>"
    )
    reward_line = f"Reward: {reward:g}\n" if reward is not None else ""
    return (
        f"{reward_line}Turn {turn}:\nState:\n{state}\n"
        f"You have {actions_left} action(s) left. Reply exactly as {reply_format} with no other text."
    )


def history_block(turns: list[tuple[int, str, str, float]]) -> str:
    """The earlier turns of a ``single_turn`` window as text: per (1-based turn, state, reply text, env reward), what
    the model saw, answered and got; empty when the window holds only the current turn."""
    if not turns:
        return ""
    lines = ["Earlier turns:"]
    for number, state, reply, reward in turns:
        lines.append(f"Turn {number} state:\n{state}\nTurn {number} reply: {reply}\nTurn {number} reward: {reward:g}")
        lines.append("---")
    return "\n".join(lines) + "\n"


def rules_text(env: Any, style: str) -> str:
    """What the first message says of the env's rules: its instruction, or its one-line rule (``compact``)."""
    return env.brief() if style == "compact" else env.instruction()


def reply_prefix(enable_think: bool, think_prefix: bool) -> str:
    """The text every reply starts with, placed in the prompt after the assistant header: ``<think>`` when replies
    think and ``rollout.think_prefix`` is on (as RAGEN does: the model continues from inside the thinking block),
    else nothing."""
    return THINK_PREFIX if enable_think and think_prefix else ""


class PromptTooLong(ValueError):
    """A text to encode that the model's context cannot hold, told by its length in characters alone (it is not
    tokenised): ``characters`` > ``context_tokens`` x ``chars_per_token`` x 2, where ``chars_per_token`` is the
    longest token of the tokenizer's vocabulary in characters (so every token spells at most that many; the 2 leaves
    room for a normaliser that joins characters, NFC's accents)."""

    def __init__(self, characters: int, context_tokens: int, chars_per_token: int) -> None:
        super().__init__(
            f"{characters:,} characters, more than the model's context of {context_tokens:,} tokens can hold (a "
            f"token of its tokenizer spells at most {chars_per_token} characters)"
        )
        self.characters, self.context_tokens, self.chars_per_token = characters, context_tokens, chars_per_token


class ChatFormatter:
    """Turns chat messages into token ids with the tokenizer's own chat template.

    ``reply_prefix`` (see :func:`reply_prefix`) ends every prompt, after the assistant header: it is part of the
    prompt (never trained), and the reply the parser reads is the prefix followed by the generated text. ``style``
    (:data:`PROMPT_STYLES`) is how the user messages are written; the ``compact`` style has no system message.
    ``context_tokens``: the model's context (None: unknown, unchecked); a text far too long for it is refused before
    it is tokenised (:class:`PromptTooLong`), and the rollouts refuse a prompt of more tokens than it."""

    def __init__(
        self,
        tokenizer: Any,
        system_prompt: str = SYSTEM_PROMPT,
        reply_prefix: str = "",
        style: str = "full",
        context_tokens: int | None = None,
    ) -> None:
        if style not in PROMPT_STYLES:
            raise ValueError(f"unknown prompt style {style!r}; use one of {', '.join(PROMPT_STYLES)}")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template; use an instruct model or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        # an export's template appends its run's reply prefix (ragen_core.agent.templates); this one adds its own
        template = base_chat_template(tokenizer.chat_template)
        self.chat_template = template if isinstance(template, str) else None  # None: the tokenizer's own choice
        self.system_prompt = None if style == "compact" else system_prompt
        self.reply_prefix = reply_prefix
        self.style = style
        self._eos_text = tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else None
        self.context_tokens = context_tokens
        self._chars_per_token: int | None = None  # the longest token in characters, found at the first check

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _system(self) -> list[dict[str, str]]:
        return [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]

    def system_messages(self) -> list[dict[str, str]]:
        """The chat's opening system message (none in the ``compact`` style)."""
        return self._system()

    @property
    def eos_text(self) -> str | None:
        """The text of the tokenizer's end-of-sequence token (None when it has none)."""
        return self._eos_text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added (special-token text is recognised); a text the
        model's context cannot hold by its length alone is refused first (:class:`PromptTooLong`), never tokenised
        (10 MB of text would take minutes and gigabytes to)."""
        if self.context_tokens is not None and len(text) > 2 * self.context_tokens * self.chars_per_token:
            raise PromptTooLong(len(text), self.context_tokens, self.chars_per_token)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def chars_per_token(self) -> int:
        """The most characters one token of the tokenizer spells: its vocabulary's longest entry (a byte-level
        entry holds one character per byte, so at least as many as the text it decodes to)."""
        if self._chars_per_token is None:
            self._chars_per_token = max(1, max(map(len, self.tokenizer.get_vocab()), default=1))
        return self._chars_per_token

    def start(self, user_text: str) -> list[int]:
        """Ids of the system message, the first user message, the assistant header and the reply prefix."""
        messages = self._system() + [{"role": "user", "content": user_text}]
        return self.encode(self._render(messages, add_generation_prompt=True) + self.reply_prefix)

    def continuation_text(self, user_text: str, reply_ended_with_eos: bool) -> str:
        """Template text after an assistant reply: its end marker (unless the reply emitted it), the next user
        message, the assistant header and the reply prefix."""
        messages = self._system() + [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": user_text},
        ]
        rendered = self._render(messages, add_generation_prompt=True)
        suffix = rendered[rendered.index(_SENTINEL) + len(_SENTINEL) :]
        if reply_ended_with_eos and self._eos_text and suffix.startswith(self._eos_text):
            suffix = suffix[len(self._eos_text) :]
        return suffix + self.reply_prefix

    def continue_after(self, user_text: str, reply_ended_with_eos: bool) -> list[int]:
        """Ids to append after an assistant reply to start the next turn."""
        return self.encode(self.continuation_text(user_text, reply_ended_with_eos))
