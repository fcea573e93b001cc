"""The multi-turn rollout engine: ``env_groups x group_size`` environments stepped turn by turn in lockstep.

Full context mode: every trajectory is one token sequence built incrementally: the first prompt, then for each turn
the sampled reply ids (trained: loss mask 1) and the tokenised environment text of the next turn (not trained: mask
0). Nothing is re-tokenised, so what the update trains on is exactly what was sampled. Windowed modes
(:mod:`ragen_core.rollout.windows`): each turn's window prompt (mask 0) and reply (mask 1) form their own sequence,
stored back to back in the trajectory's row with ``segment_lengths``; the update scores each reply in its own window.
The engine is environment-agnostic: multi-action turns, the per-trajectory action budget and the format penalty are
enforced here for every env, and so are the limits on what an env gives back: the user's own code runs under
``user_code_timeout_s`` (:func:`ragen_core.envs.external.env_step`), and a prompt longer than the model's context is
refused before it is sampled from (:class:`PromptTooLongError`). Each trajectory records how it ended
(:data:`END_REASONS`) and the env's state after its last step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from ragen_core.agent import (
    ChatFormatter,
    ParsedResponse,
    PromptTooLong,
    first_user_message,
    parse_response,
    rules_text,
    turn_message,
    turn_penalty,
)
from ragen_core.envs import make_env
from ragen_core.envs.external import UserCodeError, env_reset, env_step
from ragen_core.envs.held_out import Split, split_seeds
from ragen_core.envs.watchdog import Watchdog
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
    # Seconds one call of the user's own code (an env class's reset / step, a reward function) may take; None: no
    # limit, called in the rollout's thread (env.user_code_timeout_s)
    user_code_timeout_s: float | None = None


# How a trajectory ended (the trajectories table's end_reason), besides the env's own word for a loss when it ended the
# episode (TextEnv.end_reason: "failure" by default, FrozenLake's "hole", ...), in the order they are decided.
END_REASONS = {
    "success": "the env counts the instance solved",
    "env_step_limit": "the env's own step limit cut the episode (its truncated flag)",
    "action_budget": "env.max_actions_per_traj actions were taken",
    "token_limit": "the turns ran out and the last reply was cut at rollout.max_new_tokens",
    "format_error": "the turns ran out and the last reply drew the format penalty (tags broken, or no valid action)",
    "turn_limit": "env.max_turns replies were given",
}


class PromptTooLongError(UserCodeError):
    """An env's text makes a prompt longer than the model's context: one line naming the env, the row and the turn,
    raised before the prompt is sampled from (a longer prompt is the env's error, never a reason to train on
    millions of tokens)."""


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
        with Watchdog(spec.user_code_timeout_s) as watchdog:  # its worker starts at the user's first call, if any
            records = _roll_out(spec, backend, formatter, seed, watchdog)
    except BaseException:
        if reset is not None:
            with contextlib.suppress(Exception):
                reset()
        raise
    if reset is not None:
        reset()
    return records


def _roll_out(
    spec: RolloutSpec, backend: RolloutBackend, formatter: ChatFormatter, seed: int, watchdog: Watchdog
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
            slot.state, _ = env_reset(env, env_seed, watchdog, lambda r=record: _row(r))
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
        prompts = [_prompt(slot, turn, spec, formatter, encoded, prompter) for slot in active]
        contexts = [
            TurnContext(
                ids, slot.env, slot.actions_left, spec.max_actions_per_turn, spec.enable_think, formatter.reply_prefix
            )
            for slot, (ids, _) in zip(active, prompts, strict=True)
        ]
        generations = backend.generate(contexts, derive_seed(seed, turn))
        for slot, (_, observation), generation in zip(active, prompts, generations, strict=True):
            _apply_reply(slot, turn, observation, generation, spec, watchdog, formatter.reply_prefix)
            if prompter is not None:
                _close_segment(slot, generation)
    return [slot.record for slot in slots]


def _row(record: TrajectoryRecord, turn: int | None = None) -> str:
    """The rollout row of a trajectory (and turn), as the lake's columns name it, for errors."""
    at = f"env {record.env}, env_seed {record.env_seed}, group_id {record.group_id}, traj_index {record.traj_index}"
    return at if turn is None else f"{at}, turn_index {turn}"


def _prompt(
    slot: _Slot,
    turn: int,
    spec: RolloutSpec,
    formatter: ChatFormatter,
    encoded: dict[tuple[str, bool, bool], list[int]],
    prompter: WindowPrompter | None,
) -> tuple[list[int], str]:
    """The turn's prompt (:func:`_window_prompt` or :func:`_extend_prompt`), refused with a
    :class:`PromptTooLongError` when it is longer than the model's context (``formatter.context_tokens``): by its
    characters before it is tokenised, else by its tokens before it is sampled from."""
    limit = formatter.context_tokens
    try:
        ids, text = (
            _window_prompt(slot, prompter, limit) if prompter else _extend_prompt(slot, turn, spec, formatter, encoded)
        )
    except PromptTooLong as exc:
        too_long = f"would be {exc}"
    else:
        if limit is None or len(ids) <= limit:
            return ids, text
        too_long = f"is {len(ids):,} tokens, longer than the model's context of {limit:,} tokens"
    raise PromptTooLongError(
        f"the prompt of turn_index {turn} ({_row(slot.record)}) {too_long}: the env's text is too long for the "
        "model; shorten what the env renders (or show fewer turns: env.max_turns, rollout.context_window_mode)"
    )


def _window_prompt(slot: _Slot, prompter: WindowPrompter, limit: int | None = None) -> tuple[list[int], str]:
    """Windowed modes: start the turn's own sequence in the row with its window prompt (mask 0); a prompt of more
    than ``limit`` tokens is returned, unstored, for the caller to refuse."""
    ids, text = prompter.prompt(slot.env, slot.past, slot.state, slot.actions_left)
    if limit is not None and len(ids) > limit:
        return ids, text
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
    limit = formatter.context_tokens
    if limit is not None and len(record.input_ids) + len(ids) > limit:  # unstored: the caller refuses it
        return record.input_ids + ids, text
    record.input_ids.extend(ids)
    record.loss_mask.extend([0] * len(ids))
    if record.behavior_logprobs is not None:
        record.behavior_logprobs.extend([0.0] * len(ids))
    return record.input_ids, text


def _apply_reply(
    slot: _Slot,
    turn: int,
    observation: str,
    generation: Generation,
    spec: RolloutSpec,
    watchdog: Watchdog,
    prefix: str = "",
) -> None:
    """Record the reply's tokens, parse it (``prefix``, which ended the prompt, followed by the generated text), step
    the env with its valid actions (the user's code under the ``watchdog``), score the turn and, when it ends the
    trajectory, record how (:func:`_end_reason`) and the env's state after it."""
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
    reward, terminated, truncated, executed, infos = 0.0, False, False, [], []
    where = lambda: _row(record, turn)  # noqa: E731 - said only when the user's code fails
    for action in parsed.actions:
        slot.state, step_reward, terminated, truncated, info = env_step(slot.env, action, watchdog, where)
        reward += step_reward
        executed.append(action)
        infos.append(info)
        slot.actions_left -= 1
        if terminated or truncated:
            break
    penalty = turn_penalty(parsed, spec.format_penalty)
    record.env_reward += reward
    record.format_penalty += penalty
    record.num_actions += len(executed)
    record.success = bool(slot.env.success)
    slot.last_reward = reward
    slot.done = terminated or truncated or slot.actions_left <= 0 or turn + 1 >= spec.max_turns
    if slot.done:
        record.end_reason = _end_reason(slot, terminated, truncated, parsed, generation.truncated)
        record.final_state = slot.state
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


def _end_reason(slot: _Slot, terminated: bool, truncated: bool, parsed: ParsedResponse, reply_cut: bool) -> str:
    """Why the trajectory ended after this turn (:data:`END_REASONS`; the env's own word when it ended the episode
    unsolved: :meth:`~ragen_core.envs.base.TextEnv.end_reason`)."""
    if terminated:
        return str(slot.env.end_reason())
    if slot.env.success:
        return "success"
    if truncated:
        return "env_step_limit"
    if slot.actions_left <= 0:
        return "action_budget"
    if reply_cut:
        return "token_limit"
    return "turn_limit" if parsed.valid else "format_error"


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
