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
(:data:`END_REASONS`) and the env's state after its last step. A tool env (:class:`~ragen_core.envs.ToolEnv`) is
rolled out the same way, its prompts and replies in the model's own tool-call format
(:mod:`ragen_core.rollout.tool_turns`; full context mode only).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from ragen_core.agent import (
    ChatFormatter,
    ParsedResponse,
    PromptTooLong,
    first_tool_message,
    first_user_message,
    parse_response,
    rules_text,
    turn_message,
    turn_penalty,
)
from ragen_core.config import McpServerConfig
from ragen_core.envs.external import UserCodeError, env_reset, env_step
from ragen_core.envs.held_out import Split, split_seeds
from ragen_core.envs.mcp_tools import with_mcp_tools
from ragen_core.envs.remote import open_env
from ragen_core.envs.watchdog import Watchdog
from ragen_core.rollout.scripted import has_teacher
from ragen_core.rollout.tool_turns import ToolSlot, ToolTurns, next_messages, open_tool_turns, read_reply, run_calls
from ragen_core.rollout.types import Generation, TrajectoryRecord, TurnContext, TurnOutcome, TurnRecord
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
    # The URL of the env server that plays env_name (env.remote; its calls within user_code_timeout_s), or None: the
    # env is built in this process
    env_remote: str | None = None
    tool_timeout_s: float | None = 10.0  # a tool env: seconds one tool call may run (env.tool_timeout_s)
    tool_parser: str = "hermes"  # a tool env: the model's tool-call format (rollout.tool_parser)
    # A tool env: the MCP server whose tools join the env's (env.mcp; ragen_core.envs.mcp_tools), or None
    env_mcp: McpServerConfig | None = None


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
        self.chat: ToolSlot | None = None  # a tool env: the trajectory's chat (ragen_core.rollout.tool_turns)


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
        # each watchdog's worker starts at the first call it runs, if any: the user's code, a tool env's tools
        with Watchdog(spec.user_code_timeout_s) as watchdog, Watchdog(spec.tool_timeout_s) as tool_watchdog:
            records = _roll_out(spec, backend, formatter, seed, (watchdog, tool_watchdog))
    except BaseException:
        if reset is not None:
            with contextlib.suppress(Exception):
                reset()
        raise
    if reset is not None:
        reset()
    return records


def _roll_out(
    spec: RolloutSpec,
    backend: RolloutBackend,
    formatter: ChatFormatter,
    seed: int,
    watchdogs: tuple[Watchdog, Watchdog],
) -> list[TrajectoryRecord]:
    watchdog = watchdogs[0]
    slots: list[_Slot] = []
    seeds = spec.group_seeds
    if spec.split is not None:
        remote = (spec.env_remote, spec.user_code_timeout_s)
        seeds = split_seeds(spec.env_name, spec.env_options, seeds, spec.split, *remote)
    for group_id, env_seed in enumerate(seeds):
        for traj_index in range(spec.group_size):
            env = open_env(spec.env_name, spec.env_options, spec.env_remote, spec.user_code_timeout_s)
            env = with_mcp_tools(env, spec.env_mcp, spec.tool_timeout_s, spec.user_code_timeout_s)
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
    tools = open_tool_turns(slots[0].env, formatter, spec, watchdogs[1]) if slots else None
    for slot in slots if tools is not None else ():
        slot.chat = ToolSlot()
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
        prompts = [_prompt(slot, turn, spec, formatter, encoded, prompter, tools) for slot in active]
        limits = (spec.max_actions_per_turn, spec.enable_think, formatter.reply_prefix, spec.tool_parser)
        contexts = [
            TurnContext(ids, slot.env, slot.actions_left, *limits, group=slot.record.group_id)
            for slot, (ids, _) in zip(active, prompts, strict=True)
        ]
        generations = backend.generate(contexts, derive_seed(seed, turn))
        for slot, (_, observation), generation in zip(active, prompts, generations, strict=True):
            if tools is not None:
                _apply_tool_reply(slot, turn, observation, generation, spec, tools, formatter.reply_prefix)
                continue
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
    tools: ToolTurns | None = None,
) -> tuple[list[int], str]:
    """The turn's prompt (:func:`_window_prompt`, a tool env's :meth:`ToolTurns.prompt` or :func:`_extend_prompt`),
    refused with a :class:`PromptTooLongError` when it is longer than the model's context
    (``formatter.context_tokens``): by its characters before it is tokenised, else by its tokens before it is sampled
    from."""
    limit = formatter.context_tokens
    try:
        if tools is not None:
            style, budget = formatter.style, spec.max_actions_per_turn
            first = first_tool_message(rules_text(slot.env, style), slot.state, budget) if turn == 0 else None
            ids, text = tools.prompt(slot.chat, slot.record, first, limit)
        else:
            ids, text = (
                _window_prompt(slot, prompter, limit)
                if prompter
                else _extend_prompt(slot, turn, spec, formatter, encoded)
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
    slot.segment_start = len(slot.record.input_ids)
    slot.record.add_context(ids)
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
    record.add_context(ids)
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
    reply = _take_reply(slot, generation, prefix)
    budget = min(spec.max_actions_per_turn, slot.actions_left)
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
    outcome = TurnOutcome(parsed, reward, terminated, truncated, executed, infos)
    _close_turn(slot, turn, observation, reply, generation, spec, outcome, teacher)


def _take_reply(slot: _Slot, generation: Generation, prefix: str) -> str:
    """Append the reply's sampled tokens to the slot's sequence (mask 1, with the sampler's log-probs) and return the
    reply as parsed: ``prefix`` (which ended the prompt) followed by the generated text."""
    record = slot.record
    slot.shown = (slot.state, slot.actions_left)  # what this turn's prompt showed, before the env steps
    record.input_ids.extend(generation.token_ids)
    record.loss_mask.extend([1] * len(generation.token_ids))
    if record.behavior_logprobs is not None:
        if generation.logprobs is None:
            raise ValueError("a policy backend returned a reply without log-probs")
        record.behavior_logprobs.extend(generation.logprobs)
    slot.last_reply_finished = not generation.truncated
    return prefix + generation.text


def _close_turn(
    slot: _Slot,
    turn: int,
    observation: str,
    reply: str,
    generation: Generation,
    spec: RolloutSpec,
    outcome: TurnOutcome,
    info: dict[str, Any],
) -> None:
    """Score the turn (its env reward and format penalty), decide whether the trajectory ends after it (and how:
    :func:`_end_reason`) and keep its :class:`TurnRecord`; ``outcome`` holds what the reply's actions did (a tool
    env's also its calls' records)."""
    record, parsed, reward = slot.record, outcome.parsed, outcome.reward
    terminated, truncated = outcome.terminated, outcome.truncated
    penalty = turn_penalty(parsed, spec.format_penalty)
    record.env_reward += reward
    record.format_penalty += penalty
    record.num_actions += len(outcome.executed)
    record.success = bool(slot.env.success)
    slot.last_reward = reward
    slot.done = terminated or truncated or slot.actions_left <= 0 or turn + 1 >= spec.max_turns
    if slot.done:
        record.end_reason = _end_reason(slot, terminated, truncated, parsed, generation.truncated)
        record.final_state = slot.state
    effective = [bool(i.get("action_is_effective", True)) for i in outcome.infos]
    record.turns.append(
        TurnRecord(
            turn_index=turn,
            observation=observation,
            response=reply,
            think=parsed.think,
            answer=parsed.answer,
            actions=outcome.executed,
            valid=parsed.valid,
            format_ok=parsed.format_ok,
            reward=reward,
            penalty=penalty,
            done=slot.done,
            truncated=generation.truncated,
            response_tokens=len(generation.token_ids),
            info={"action_is_effective": effective, **info},
            tool_calls=None if slot.chat is None else [r.row() for r in outcome.records],
        )
    )


def _apply_tool_reply(
    slot: _Slot,
    turn: int,
    observation: str,
    generation: Generation,
    spec: RolloutSpec,
    tools: ToolTurns,
    prefix: str,
) -> None:
    """A tool env's reply: record its tokens, read its calls in the model's format, run them through the env within
    the turn's budget (:func:`~ragen_core.rollout.tool_turns.run_calls`), keep the env's answers as the messages that
    open the next turn, and close the turn as any other (:func:`_close_turn`)."""
    reply = _take_reply(slot, generation, prefix)
    chat = slot.chat
    strict, finished = spec.reply_format == "strict", not generation.truncated
    read, parsed = read_reply(tools, slot.env, reply, spec.enable_think, strict, finished)
    outcome = run_calls(tools, slot.env, read, parsed, min(spec.max_actions_per_turn, slot.actions_left))
    slot.actions_left -= len(outcome.executed)
    if outcome.state is not None:
        slot.state = outcome.state
    chat.seen = tools.chat.seen_after(chat.seen, generation.text, finished)
    chat.reply, chat.pending = reply, next_messages(tools, outcome, spec.enable_think)
    _close_turn(slot, turn, observation, reply, generation, spec, outcome, {})


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
