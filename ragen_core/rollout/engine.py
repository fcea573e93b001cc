"""The multi-turn rollout engine: ``env_groups x group_size`` environments stepped turn by turn in lockstep.

Full context mode: every trajectory is one token sequence built incrementally: the first prompt, then for each turn
the sampled reply ids (trained: loss mask 1) and the tokenised environment text of the next turn (not trained: mask
0). Nothing is re-tokenised, so what the update trains on is exactly what was sampled. Windowed modes
(:mod:`ragen_core.rollout.windows`): each turn's window prompt (mask 0) and reply (mask 1) form their own sequence,
stored back to back in the trajectory's row with ``segment_lengths``; the update scores each reply in its own window.
The engine is environment-agnostic: multi-action turns, the per-trajectory action budget and the format penalty are
enforced here for every env.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from ragen_core.agent import (
    ChatFormatter,
    first_user_message,
    parse_response,
    rules_text,
    turn_message,
    turn_penalty,
)
from ragen_core.envs import make_env
from ragen_core.envs.external import env_reset, env_step
from ragen_core.envs.held_out import Split, split_seeds
from ragen_core.rollout.scripted import has_teacher
from ragen_core.rollout.types import Generation, TrajectoryRecord, TurnContext, TurnRecord
from ragen_core.rollout.windows import PastTurn, WindowPrompter
from ragen_core.seeding import derive_seed


class RolloutBackend(Protocol):
    """Produces one reply per context. ``seed`` fixes all sampling randomness of the call."""

    behavior_source: str

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]: ...


@dataclass(frozen=True)
class RolloutSpec:
    """What to roll out: an environment, one seed per group, the group size and the interaction limits."""

    env_name: str
    group_seeds: list[int]
    group_size: int
    max_turns: int
    max_actions_per_turn: int
    max_actions_per_traj: int
    enable_think: bool = True
    format_penalty: float = -0.1
    reply_format: str = "strict"  # rollout.reply_format (ragen_core.agent.parsing)
    env_options: dict[str, Any] | None = None
    context_window_mode: str = "full"
    max_context_window: int | None = None  # turns in the window (windowed modes only)
    # Whose maps to draw, for an env that holds out maps (ragen_core.envs.held_out): a seed drawing a map of the
    # other side is replaced by the next seed of its stream that does not. None plays the seeds as given.
    split: Split | None = None


class _Slot:
    """Mutable per-trajectory state while rolling out."""

    def __init__(self, record: TrajectoryRecord, env: Any, actions_left: int) -> None:
        self.record = record
        self.env = env
        self.actions_left = actions_left
        self.done = False
        self.state = ""
        self.last_reward: float | None = None
        self.last_reply_finished = True
        self.past: list[PastTurn] = []  # windowed modes: the finished turns
        self.segment_start = 0  # windowed modes: where the current turn's sequence starts in the row
        self.shown: tuple[str, int] = ("", actions_left)  # the state and budget the current turn's prompt showed


def run_rollouts(
    spec: RolloutSpec, backend: RolloutBackend, formatter: ChatFormatter, seed: int
) -> list[TrajectoryRecord]:
    """Roll out every (group, member) of ``spec`` with ``backend``; ``seed`` drives the sampling of every turn.

    A backend with a ``reset()`` (the Hugging Face backend's per-rollout key/value caches) is reset before and after,
    so a rollout never depends on what the backend did before it. When the rollout fails, the reset after it is
    tried, but its own error never hides the rollout's (a dead vLLM server fails both: the error names the request
    that met it mid-rollout).
    """
    reset = getattr(backend, "reset", None)
    if reset is not None:
        reset()
    try:
        records = _roll_out(spec, backend, formatter, seed)
    except BaseException:
        if reset is not None:
            with contextlib.suppress(Exception):
                reset()
        raise
    if reset is not None:
        reset()
    return records


def _roll_out(
    spec: RolloutSpec, backend: RolloutBackend, formatter: ChatFormatter, seed: int
) -> list[TrajectoryRecord]:
    slots: list[_Slot] = []
    seeds = spec.group_seeds
    if spec.split is not None:
        seeds = split_seeds(spec.env_name, spec.env_options, seeds, spec.split)
    for group_id, env_seed in enumerate(seeds):
        for traj_index in range(spec.group_size):
            env = make_env(spec.env_name, **(spec.env_options or {}))
            record = TrajectoryRecord(
                env=spec.env_name,
                group_id=group_id,
                traj_index=traj_index,
                env_seed=env_seed,
                behavior_source=backend.behavior_source,
                behavior_logprobs=[] if backend.behavior_source == "policy" else None,
            )
            slot = _Slot(record, env, spec.max_actions_per_traj)
            slot.state, _ = env_reset(env, env_seed)
            slots.append(slot)

    encoded: dict[tuple[str, bool, bool], list[int]] = {}  # group members mostly see the same text: encode once
    prompter = None
    if spec.context_window_mode != "full":
        if spec.max_context_window is None:
            raise ValueError(f"context window mode {spec.context_window_mode!r} needs max_context_window")
        prompter = WindowPrompter(
            formatter, spec.context_window_mode, spec.max_context_window, spec.max_actions_per_turn, spec.enable_think
        )
    for turn in range(spec.max_turns):
        active = [slot for slot in slots if not slot.done]
        if not active:
            break
        prompts = [
            _window_prompt(slot, prompter) if prompter else _extend_prompt(slot, turn, spec, formatter, encoded)
            for slot in active
        ]
        contexts = [
            TurnContext(
                ids, slot.env, slot.actions_left, spec.max_actions_per_turn, spec.enable_think, formatter.reply_prefix
            )
            for slot, (ids, _) in zip(active, prompts, strict=True)
        ]
        generations = backend.generate(contexts, derive_seed(seed, turn))
        for slot, (_, observation), generation in zip(active, prompts, generations, strict=True):
            _apply_reply(slot, turn, observation, generation, spec, formatter.reply_prefix)
            if prompter is not None:
                _close_segment(slot, generation)
    return [slot.record for slot in slots]


def _window_prompt(slot: _Slot, prompter: WindowPrompter) -> tuple[list[int], str]:
    """Windowed modes: start the turn's own sequence in the row with its window prompt (mask 0)."""
    ids, text = prompter.prompt(slot.env, slot.past, slot.state, slot.actions_left)
    record = slot.record
    slot.segment_start = len(record.input_ids)
    record.input_ids.extend(ids)
    record.loss_mask.extend([0] * len(ids))
    if record.behavior_logprobs is not None:
        record.behavior_logprobs.extend([0.0] * len(ids))
    return ids, text


def _close_segment(slot: _Slot, generation: Generation) -> None:
    """Windowed modes: record the turn's sequence length and keep the turn for later windows."""
    record, turn = slot.record, slot.record.turns[-1]
    if record.segment_lengths is None:
        record.segment_lengths = []
    record.segment_lengths.append(len(record.input_ids) - slot.segment_start)
    state, budget = slot.shown
    finished = not generation.truncated
    slot.past.append(PastTurn(state, budget, generation.token_ids, turn.response, finished, turn.reward))


def opening_message(
    env: Any, state: str, actions_left: int, max_actions_per_turn: int, enable_think: bool, style: str
) -> str:
    """The first user message of a trajectory: the env's rules, its actions, the per-turn limit and turn 1's state and
    budget (what ``ragen export``'s README shows a client, from this same function)."""
    text = turn_message(1, state, actions_left, enable_think, None, style)
    return first_user_message(rules_text(env, style), env.action_names, max_actions_per_turn, text, style)


def _extend_prompt(
    slot: _Slot,
    turn: int,
    spec: RolloutSpec,
    formatter: ChatFormatter,
    encoded: dict[tuple[str, bool, bool], list[int]],
) -> tuple[list[int], str]:
    """Full mode: append the environment text of this turn to the slot's sequence (mask 0); return the sequence (the
    prompt; the very list, so a backend can continue its cache) and that text.

    ``encoded`` memoises the ids of each distinct (text, first turn, previous reply finished): encoding is a pure
    function of those, so the ids are exactly what encoding again would give.
    """
    record = slot.record
    style = formatter.style
    if turn == 0:
        limits = (slot.actions_left, spec.max_actions_per_turn)
        text = opening_message(slot.env, slot.state, *limits, spec.enable_think, style)
    else:
        text = turn_message(turn + 1, slot.state, slot.actions_left, spec.enable_think, slot.last_reward, style)
    key = (text, turn == 0, slot.last_reply_finished)
    ids = encoded.get(key)
    if ids is None:
        ids = formatter.start(text) if turn == 0 else formatter.continue_after(text, slot.last_reply_finished)
        encoded[key] = ids
    record.input_ids.extend(ids)
    record.loss_mask.extend([0] * len(ids))
    if record.behavior_logprobs is not None:
        record.behavior_logprobs.extend([0.0] * len(ids))
    return record.input_ids, text


def _apply_reply(
    slot: _Slot, turn: int, observation: str, generation: Generation, spec: RolloutSpec, prefix: str = ""
) -> None:
    """Record the reply's tokens, parse it (``prefix``, which ended the prompt, followed by the generated text), step
    the env with its valid actions and score the turn."""
    record = slot.record
    slot.shown = (slot.state, slot.actions_left)  # what this turn's prompt showed, before the env steps
    record.input_ids.extend(generation.token_ids)
    record.loss_mask.extend([1] * len(generation.token_ids))
    if record.behavior_logprobs is not None:
        if generation.logprobs is None:
            raise ValueError("a policy backend returned a reply without log-probs")
        record.behavior_logprobs.extend(generation.logprobs)
    slot.last_reply_finished = not generation.truncated

    budget = min(spec.max_actions_per_turn, slot.actions_left)
    reply = prefix + generation.text
    parsed = parse_response(
        reply, slot.env.parse_action, budget, spec.enable_think, spec.reply_format, not generation.truncated
    )
    teacher = _teacher_agreement(slot.env, slot.actions_left, parsed.actions)  # before the env steps
    teacher.update(_perception(slot.env, parsed.think, spec.enable_think))
    reward, terminated, executed, infos = 0.0, False, [], []
    for action in parsed.actions:
        slot.state, step_reward, terminated, truncated, info = env_step(slot.env, action)
        reward += step_reward
        executed.append(action)
        infos.append(info)
        slot.actions_left -= 1
        if terminated or truncated:
            terminated = True
            break
    penalty = turn_penalty(parsed, spec.format_penalty)
    record.env_reward += reward
    record.format_penalty += penalty
    record.num_actions += len(executed)
    record.success = bool(slot.env.success)
    slot.last_reward = reward
    slot.done = terminated or slot.actions_left <= 0 or turn + 1 >= spec.max_turns
    record.turns.append(
        TurnRecord(
            turn_index=turn,
            observation=observation,
            response=reply,
            think=parsed.think,
            answer=parsed.answer,
            actions=executed,
            valid=parsed.valid,
            format_ok=parsed.format_ok,
            reward=reward,
            penalty=penalty,
            done=slot.done,
            truncated=generation.truncated,
            response_tokens=len(generation.token_ids),
            info={"action_is_effective": [bool(i.get("action_is_effective", True)) for i in infos], **teacher},
        )
    )


def _perception(env: Any, think: str, enable_think: bool) -> dict[str, Any]:
    """The perception diagnostic of one turn, for envs that describe their state (``TextEnv.describe``): whether
    the reply's thinking is exactly the description of the state the turn saw (``think_right``; a reply without a
    think block is wrong). Empty where the env has no description or thinking is off."""
    description = env.describe() if enable_think else None
    return {} if description is None else {"think_right": think == description}


def _teacher_agreement(env: Any, actions_left: int, actions: list[str]) -> dict[str, Any]:
    """The teacher-agreement diagnostic of one turn, for envs with a teacher (``TextEnv.teacher_actions``): the
    teacher's best moves from the state the turn saw, whether the reply's first action is one of them
    (``teacher_agree``; a reply without a valid action disagrees), and the rate at which a uniformly random action
    would (``teacher_chance``). Empty where the env has no teacher, no move is better than another, or answers are
    free-form (no action names: no chance rate to compare with)."""
    if not has_teacher(env) or not env.action_names:
        return {}
    best = env.teacher_actions(actions_left)
    if not best or len(best) == len(env.action_names):
        return {}
    return {
        "teacher_actions": best,
        "teacher_agree": bool(actions) and actions[0] in best,
        "teacher_chance": len(best) / len(env.action_names),
    }
