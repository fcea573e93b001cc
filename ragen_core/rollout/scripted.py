"""The scripted rollout backend: replies written by Python policies, tokenised like model replies.

Scripted replies are well-formed and have no behaviour log-probs (``behavior_source='scripted'``). Policies are
registered by name: ``random`` (uniformly random valid actions), ``expert`` (the env's own expert plan),
``describe_random`` (random actions, thinking that describes the state: ``TextEnv.describe``) and ``teacher_mix``
(the teacher's move with probability ``teacher_prob``, else a random one; thinking that describes the state). A policy
returns the reply's action names, or a :class:`ScriptedReply` when it also writes the thinking. Policies that take
options (``teacher_prob``) get them as keyword arguments (:class:`ScriptedBackend`'s ``options``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ragen_core.envs import TextEnv
from ragen_core.envs.external import env_step
from ragen_core.envs.tool_env import is_tool_env
from ragen_core.envs.watchdog import Watchdog
from ragen_core.registry import Registry
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.tools import ToolCall, tool_parser

if TYPE_CHECKING:
    from ragen_core.config import RunConfig


@dataclass(frozen=True)
class ScriptedReply:
    """A scripted reply: its actions and, optionally, its thinking (None: "I will take <actions>.")."""

    actions: list[str]
    think: str | None = None


ScriptedPolicy = Callable[[TurnContext, np.random.Generator], "list[str] | ScriptedReply"]
_POLICIES: Registry[ScriptedPolicy] = Registry("scripted policy")


def register_scripted_policy(name: str) -> Callable[[ScriptedPolicy], ScriptedPolicy]:
    """Register a policy mapping (context, rng, **options) to the action names of one reply (or a ScriptedReply)."""
    return _POLICIES.register(name)


def get_scripted_policy(name: str, **options: Any) -> ScriptedPolicy:
    """The scripted policy registered as ``name``, with ``options`` bound (only those its signature takes)."""
    policy = _POLICIES.get(name)
    accepted = {key: value for key, value in options.items() if key in inspect.signature(policy).parameters}
    return functools.partial(policy, **accepted) if accepted else policy


def scripted_options(config: RunConfig) -> dict[str, Any]:
    """The options the config gives scripted policies (``teacher_mix``'s ``teacher_prob``)."""
    return {"teacher_prob": config.bootstrap.teacher_prob}


def registered_scripted_policies() -> list[str]:
    """Names accepted by :func:`get_scripted_policy`, sorted."""
    return _POLICIES.names()


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


@register_scripted_policy("teacher_mix")
def teacher_mix_policy(context: TurnContext, rng: np.random.Generator, teacher_prob: float = 0.5) -> ScriptedReply:
    """One action: with probability ``teacher_prob`` one of the teacher's best moves (``env.teacher_actions``, drawn
    uniformly among ties), else a uniformly random valid action; the thinking describes the state
    (``env.describe()``). A bootstrap on these replies is the weak prior a pretrained model brings: the state read
    right, the good move preferred, not always taken."""
    env = context.env
    teacher = env.teacher_actions(context.actions_left)
    if teacher is None and not has_teacher(env):
        raise ValueError(f"the teacher_mix policy needs an env with a teacher; {env.name} has none")
    draw = rng.random()  # drawn every turn, so the random stream does not depend on whether the teacher had a move
    action = teacher[int(rng.integers(len(teacher)))] if teacher and draw < teacher_prob else env.sample_action(rng)
    return ScriptedReply([action], env.describe())


def has_teacher(env: TextEnv) -> bool:
    """Whether ``env``'s class defines a teacher (:meth:`TextEnv.teacher_actions`)."""
    return type(env).teacher_actions is not TextEnv.teacher_actions


def play_scripted(
    env: TextEnv,
    policy: ScriptedPolicy,
    rng: np.random.Generator,
    limits: tuple[int, int, int],
    enable_think: bool = True,
    on_reply: Callable[[ScriptedReply], None] | None = None,
    watchdog: Watchdog | None = None,
) -> bool:
    """Play one episode of a reset ``env`` with a scripted ``policy`` under the rollout engine's limits
    ``(max_turns, max_actions_per_turn, max_actions_per_traj)``, without a tokenizer or a prompt (the policies read
    the env, never the prompt); ``on_reply`` sees each reply; the user's own env steps under the ``watchdog``.
    Returns whether the episode succeeded."""
    max_turns, per_turn, actions_left = limits
    for _ in range(max_turns):
        reply = policy(TurnContext([], env, actions_left, per_turn, enable_think), rng)
        reply = reply if isinstance(reply, ScriptedReply) else ScriptedReply(list(reply))
        if on_reply is not None:
            on_reply(reply)
        for action in reply.actions[: max(1, min(per_turn, actions_left))]:
            _, _, terminated, truncated, _ = env_step(env, action, watchdog)
            actions_left -= 1
            if terminated or truncated or actions_left <= 0:
                return bool(env.success)
    return bool(env.success)


def format_reply(actions: list[str], enable_think: bool, think: str | None = None) -> str:
    """A well-formed reply naming ``actions``, thinking ``think`` (default: "I will take <actions>.")."""
    answer = " || ".join(actions)
    if not enable_think:
        return f"<answer>{answer}</answer>"
    if think is None:
        think = f"I will take {', then '.join(actions)}."
    return f"<think>{think}</think><answer>{answer}</answer>"


def format_tool_reply(calls: list[str], enable_think: bool, parser: str, think: str | None = None) -> str:
    """A well-formed reply of a tool env making ``calls`` (their :meth:`ToolCall.text`) in the format of ``parser``
    (``rollout.tool_parser``), after thinking ``think`` when replies think (default: "I will call <names>.")."""
    parsed = [ToolCall.from_text(call) for call in calls]
    if enable_think and think is None:
        think = f"I will call {', then '.join(call.name for call in parsed)}."
    return tool_parser(parser).write(parsed, think if enable_think else None)


class ScriptedBackend:
    """Writes replies with a scripted policy and tokenises them (plus the stop token) like sampled replies."""

    behavior_source = "scripted"

    def __init__(self, policy: str | ScriptedPolicy, tokenizer: Any, options: dict[str, Any] | None = None) -> None:
        self.policy = get_scripted_policy(policy, **(options or {})) if isinstance(policy, str) else policy
        self.tokenizer = tokenizer

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        rng = np.random.default_rng(seed)
        results = []
        for context in contexts:
            reply = self.policy(context, rng)
            if not isinstance(reply, ScriptedReply):
                reply = ScriptedReply(list(reply))
            if is_tool_env(context.env):
                text = format_tool_reply(reply.actions, context.enable_think, context.tool_parser, reply.think)
            else:
                text = format_reply(reply.actions, context.enable_think, reply.think)
            if context.reply_prefix and text.startswith(context.reply_prefix):  # the prompt already ends with it
                text = text[len(context.reply_prefix) :]
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.tokenizer.eos_token_id]
            results.append(Generation(ids, None, text, truncated=False))
        return results
