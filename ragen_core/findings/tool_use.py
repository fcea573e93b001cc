"""Agents that use tools: does RL lift held-out success of a tool-calling agent above its bootstrapped level, and
where it does not, what the agent's calls say about why?

Per arm (one tool env each) the lift is the multi-turn finding's (:func:`ragen_core.findings.multiturn.lift`: at
least ``params.min_lift`` and beyond two standard errors), with its verdict and the measured reference levels of the
scripted policies. Beside success, each validation's calls are read from the lake (the ``turns`` table's
``tool_calls``, the ``trajectories`` table's seeds): tool calls per episode; the malformed share, the calls the env
could not run because the reply was the agent's error (:data:`ragen_core.tools.calls.MALFORMED`: bad JSON, an unknown
tool, arguments that do not fit the schema); the share of episodes cut at the token limit; and, for the first call of
each episode, whether it is exactly the teacher's (the same tool with the same arguments, as parsed JSON), whether
it names the teacher's tool, and whether its arguments have the teacher's shape (equal once every literal, a digit
run, a capitalised word or a quoted string, is masked): the teacher is replayed on the episode's own instance (its
``env_seed``). And whether the agent copies: the share of the first calls' literals (digit runs and capitalised
words in their arguments) that the episode's first observation contains. An agent that calls the right tool in the
right shape with literals of its own (names and numbers not from the question) is told so by these shares, which is
the measured reason a run does not lift when its successes are too rare for RL to sharpen.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ragen_core.envs import make_env
from ragen_core.findings.analysis import Arm, Context, curve, register, spread
from ragen_core.findings.multiturn import arm_lifts, reference_levels
from ragen_core.storage import query
from ragen_core.tools.calls import MALFORMED
from ragen_core.tools.parsers import ToolCall

CALLS, MALFORMED_SHARE, TRUNCATED = "calls_per_episode", "malformed_share", "truncated_share"
TEACHER_CALL, TEACHER_TOOL, TEACHER_SHAPE = "first_call_is_teacher", "first_tool_is_teacher", "first_shape_is_teacher"
COPIED = "literals_from_question"
MEASURES = (CALLS, MALFORMED_SHARE, TRUNCATED, TEACHER_CALL, TEACHER_TOOL, TEACHER_SHAPE, COPIED)
LITERAL = re.compile(r"\d+|\b[A-Z][a-z]+\b")  # a digit run, or a capitalised word (SQL keywords are upper case)
QUOTED = re.compile(r"'[^']*'")

CALLS_QUERY = """
    WITH episodes AS (
        SELECT run_id, iteration, count(*) AS episodes, avg(truncated::INT) AS truncated FROM trajectories
        WHERE list_contains($runs, run_id) AND split = 'val' AND env = $env GROUP BY run_id, iteration),
    calls AS (
        SELECT run_id, iteration, unnest(tool_calls) AS call FROM turns
        WHERE list_contains($runs, run_id) AND split = 'val' AND env = $env),
    counted AS (
        SELECT run_id, iteration, count(*) AS calls,
               count(*) FILTER (WHERE list_contains($malformed, struct_extract(call, 'error'))) AS malformed
        FROM calls GROUP BY run_id, iteration)
    SELECT e.run_id, e.iteration, e.episodes, e.truncated, coalesce(c.calls, 0) AS calls,
           coalesce(c.malformed, 0) AS malformed
    FROM episodes e LEFT JOIN counted c USING (run_id, iteration) ORDER BY e.run_id, e.iteration
"""

FIRST_CALLS_QUERY = """
    SELECT t.run_id, t.iteration, j.env_seed, t.observation, t.tool_calls[1].name AS name,
           t.tool_calls[1].arguments AS arguments
    FROM turns t JOIN trajectories j USING (run_id, iteration, split, env, group_id, traj_index)
    WHERE list_contains($runs, t.run_id) AND t.split = 'val' AND t.env = $env AND t.turn_index = 0
    ORDER BY t.run_id, t.iteration, j.env_seed
"""


def teacher_first_call(env: Any, seed: int, max_actions: int) -> ToolCall:
    """The teacher's first call on the instance of ``seed`` (``env`` is reset to it)."""
    env.reset(seed)
    return ToolCall.from_text(env.teacher_actions(max_actions)[0])


def _parsed(arguments: str | None) -> Any:
    try:
        return json.loads(arguments) if arguments is not None else None
    except ValueError:
        return None


def shape(value: Any) -> Any:
    """``value`` (parsed JSON arguments) with every literal of its strings masked: quoted strings, then digit runs
    and capitalised words (:data:`LITERAL`)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, str):
        return LITERAL.sub("#", QUOTED.sub("'?'", value))
    return "#" if isinstance(value, int | float) and not isinstance(value, bool) else value


def first_call_match(name: str | None, arguments: str | None, teacher: ToolCall) -> tuple[bool, bool, bool]:
    """Whether a first call (its tool's name and its arguments as the turns table keeps them: JSON, or the call's
    text when it did not parse; both None when the episode's first reply called nothing) is the teacher's call,
    names the teacher's tool, and has the teacher's arguments' :func:`shape`."""
    if name != teacher.name:
        return False, False, False
    given = _parsed(arguments)
    return given == teacher.arguments, True, given is not None and shape(given) == shape(teacher.arguments)


def literals_copied(arguments: str | None, observation: str) -> tuple[int, int]:
    """Of the literals (:data:`LITERAL`) in a call's arguments (the JSON text as stored, or the unparsed call), how
    many the observation contains as whole words, and how many there are."""
    found = LITERAL.findall(arguments or "")
    words = set(LITERAL.findall(observation))
    return sum(word in words for word in found), len(found)


def call_measures(ctx: Context, arm: Arm, env_name: str) -> dict[str, dict[int, dict[str, float]]]:
    """Per run, per validation iteration: the seven measures of the module docstring (run ids, env and the error
    names are bound parameters)."""
    config = arm.config
    params = {"runs": list(arm.run_ids), "env": env_name}
    series: dict[str, dict[int, dict[str, float]]] = {run: {} for run in arm.run_ids}
    for row in query(ctx.lake, CALLS_QUERY, params={**params, "malformed": list(MALFORMED)}).to_pylist():
        calls = int(row["calls"])
        series[row["run_id"]][int(row["iteration"])] = {
            CALLS: calls / int(row["episodes"]),
            MALFORMED_SHARE: int(row["malformed"]) / calls if calls else float("nan"),
            TRUNCATED: float(row["truncated"]),
        }
    env = make_env(env_name, **dict(config.env.options))
    teachers: dict[int, ToolCall] = {}
    firsts: dict[tuple[str, int], list[tuple[bool, bool, bool, int, int]]] = {}
    for row in query(ctx.lake, FIRST_CALLS_QUERY, params=params).to_pylist():
        seed = int(row["env_seed"])
        if seed not in teachers:
            teachers[seed] = teacher_first_call(env, seed, config.env.max_actions_per_traj)
        match = first_call_match(row["name"], row["arguments"], teachers[seed])
        copied = literals_copied(row["arguments"], row["observation"])
        firsts.setdefault((row["run_id"], int(row["iteration"])), []).append((*match, *copied))
    for (run, iteration), found in firsts.items():
        point = series[run].setdefault(iteration, {})
        for index, measure in enumerate((TEACHER_CALL, TEACHER_TOOL, TEACHER_SHAPE)):
            point[measure] = sum(f[index] for f in found) / len(found)
        literals = sum(f[4] for f in found)
        point[COPIED] = sum(f[3] for f in found) / literals if literals else float("nan")
    return series


def _measure_curve(series: dict[str, dict[int, dict[str, float]]], measure: str) -> list[dict[str, Any]]:
    by_iteration: dict[int, list[float]] = {}
    for points in series.values():
        for iteration, values in points.items():
            if measure in values:
                by_iteration.setdefault(iteration, []).append(values[measure])
    return [{"iteration": i, **spread(v)} for i, v in sorted(by_iteration.items())]


def _ends(points: dict[int, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """A run's measures at its first and at its last validation."""
    if not points:
        return {"first": {}, "final": {}}
    return {"first": points[min(points)], "final": points[max(points)]}


def _arm(ctx: Context, arm: Arm, repeats: int, min_lift: float) -> dict[str, Any]:
    head = arm_lifts(ctx, arm, min_lift)
    config, env_name, runs = arm.config, head["env"], head["runs"]
    series = call_measures(ctx, arm, env_name)
    for run, numbers in runs.items():
        ends = _ends(series[run])
        numbers.update(measures_first=ends["first"], measures_final=ends["final"])
    return {
        **head,
        **{
            f"{measure}_{end}": spread([r[f"measures_{end}"].get(measure) for r in runs.values()])
            for measure in MEASURES
            for end in ("first", "final")
        },
        "held_out": config.eval.held_out,
        "references": reference_levels(config, env_name, repeats),
        "curves": {
            head["val_key"]: curve(ctx, arm, head["val_key"]),
            **{m: _measure_curve(series, m) for m in MEASURES},
        },
    }


@register("tool_use")
def tool_use(ctx: Context) -> dict[str, Any]:
    """Per arm: the verdict, each run's lift and its standard error, the calls' measures at the first and the last
    validation (module docstring), the measured reference levels and the curves."""
    repeats = int(ctx.params.get("reference_repeats", 4))
    min_lift = float(ctx.params.get("min_lift", 0.1))
    arms = {arm.label: _arm(ctx, arm, repeats, min_lift) for arm in ctx.arms}
    return {"min_lift": min_lift, "arms": arms}
