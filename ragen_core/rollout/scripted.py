"""The scripted rollout backend: replies written by Python policies, tokenised like model replies.

Scripted replies are well-formed and have no behaviour log-probs (``behavior_source='scripted'``). Policies are
registered by name: ``random`` (uniformly random valid actions), ``expert`` (the env's own expert plan) and
``describe_random`` (random actions, thinking that describes the state: ``TextEnv.describe``). A policy returns the
reply's action names, or a :class:`ScriptedReply` when it also writes the thinking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragen_core.rollout.types import Generation, TurnContext


@dataclass(frozen=True)
class ScriptedReply:
    """A scripted reply: its actions and, optionally, its thinking (None: "I will take <actions>.")."""

    actions: list[str]
    think: str | None = None


ScriptedPolicy = Callable[[TurnContext, np.random.Generator], "list[str] | ScriptedReply"]
_POLICIES: dict[str, ScriptedPolicy] = {}


def register_scripted_policy(name: str) -> Callable[[ScriptedPolicy], ScriptedPolicy]:
    """Register a policy mapping (context, rng) to the list of action names of one reply."""

    def decorator(policy: ScriptedPolicy) -> ScriptedPolicy:
        _POLICIES[name] = policy
        return policy

    return decorator


def get_scripted_policy(name: str) -> ScriptedPolicy:
    """The scripted policy registered as ``name``."""
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scripted policy {name!r}; registered: {', '.join(sorted(_POLICIES))}") from None


def registered_scripted_policies() -> list[str]:
    return sorted(_POLICIES)


@register_scripted_policy("random")
def random_policy(context: TurnContext, rng: np.random.Generator) -> list[str]:
    """1..max actions (within the remaining budget), each a uniformly random valid action of the env."""
    budget = max(1, min(context.max_actions_per_turn, context.actions_left))
    count = int(rng.integers(1, budget + 1))
    return [context.env.sample_action(rng) for _ in range(count)]


@register_scripted_policy("expert")
def expert_policy(context: TurnContext, rng: np.random.Generator) -> list[str]:
    """The env's expert plan from the current state (``env.expert_plan(actions_left)``), cut to this turn's limit."""
    budget = max(1, min(context.max_actions_per_turn, context.actions_left))
    plan = list(context.env.expert_plan(context.actions_left))[:budget]
    return plan or [context.env.sample_action(rng)]


@register_scripted_policy("describe_random")
def describe_random_policy(context: TurnContext, rng: np.random.Generator) -> ScriptedReply:
    """The ``random`` policy's actions, with thinking that says what the state shows (``env.describe()``) and
    nothing of the choice: a bootstrap on these replies teaches reading the state, never which action is better."""
    description = context.env.describe()
    if description is None:
        raise ValueError(
            f"the describe_random policy needs an env that describes its states; {context.env.name} does not "
            "(use bootstrap.policy=random)"
        )
    return ScriptedReply(random_policy(context, rng), description)


def format_reply(actions: list[str], enable_think: bool, think: str | None = None) -> str:
    """A well-formed reply naming ``actions``, thinking ``think`` (default: "I will take <actions>.")."""
    answer = " || ".join(actions)
    if not enable_think:
        return f"<answer>{answer}</answer>"
    if think is None:
        think = f"I will take {', then '.join(actions)}."
    return f"<think>{think}</think><answer>{answer}</answer>"


class ScriptedBackend:
    """Writes replies with a scripted policy and tokenises them (plus the stop token) like sampled replies."""

    behavior_source = "scripted"

    def __init__(self, policy: str | ScriptedPolicy, tokenizer: Any) -> None:
        self.policy = get_scripted_policy(policy) if isinstance(policy, str) else policy
        self.tokenizer = tokenizer

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        rng = np.random.default_rng(seed)
        results = []
        for context in contexts:
            reply = self.policy(context, rng)
            if not isinstance(reply, ScriptedReply):
                reply = ScriptedReply(list(reply))
            text = format_reply(reply.actions, context.enable_think, reply.think)
            if context.reply_prefix and text.startswith(context.reply_prefix):  # the prompt already ends with it
                text = text[len(context.reply_prefix) :]
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
            results.append(Generation(ids, None, text, truncated=False))
        return results
