"""The scripted rollout backend: replies written by Python policies, tokenised like model replies.

Scripted replies are well-formed and have no behaviour log-probs (``behavior_source='scripted'``). Policies are
registered by name: ``random`` (uniformly random valid actions) and ``expert`` (the env's own expert plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ragen_core.rollout.types import Generation, TurnContext

ScriptedPolicy = Callable[[TurnContext, np.random.Generator], list[str]]
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


def format_reply(actions: list[str], enable_think: bool) -> str:
    """A well-formed reply naming ``actions``."""
    answer = " || ".join(actions)
    if not enable_think:
        return f"<answer>{answer}</answer>"
    return f"<think>I will take {', then '.join(actions)}.</think><answer>{answer}</answer>"


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
            text = format_reply(self.policy(context, rng), context.enable_think)
            if context.reply_prefix and text.startswith(context.reply_prefix):  # the prompt already ends with it
                text = text[len(context.reply_prefix) :]
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
            results.append(Generation(ids, None, text, truncated=False))
        return results
