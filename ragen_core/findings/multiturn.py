"""Multi-turn learning from a weak prior: does RL lift validation success above the bootstrapped model's own level,
in every seed, on each multi-turn env?

Per arm (one env each): validation success at iteration 0 (the bootstrapped model, before any update) and at the last
validation; a run's lift counts when it is at least ``params.min_lift`` (0.08) and beyond two standard errors of the
difference of the two estimates (``sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n)``, n = validation episodes). The verdict is
"reproduced" when every run of the arm lifts, "partly" when some do, "not reproduced" when none does. The prior is
shown by the teacher-agreement diagnostic (``val/<env>/teacher_agreement`` against ``teacher_chance``), the
perception by ``val/<env>/think_right`` (the share of validation replies whose thinking is the state's
description). Reference levels are measured here, not typed in: scripted policies (random moves, the bootstrap's
own teacher mix, the teacher) played on the same validation instances under the same limits,
``params.reference_repeats`` times each. How held out the validation was is measured too: the share of each
run's validation instances whose first state it also met in training or in its bootstrap (``val_seen_in_training``;
none when ``eval.held_out=maps``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ragen_core.config import RunConfig
from ragen_core.envs import make_env
from ragen_core.envs.held_out import validation_seeds
from ragen_core.findings.analysis import (
    Arm,
    Context,
    curve,
    first_value,
    last_value,
    register,
    spread,
    validation_overlap,
)
from ragen_core.rollout.scripted import get_scripted_policy, has_teacher, play_scripted
from ragen_core.seeding import derive_seed
from ragen_core.storage import query

AGREEMENT, CHANCE, PERCEPTION = "teacher_agreement", "teacher_chance", "think_right"


def reference_levels(config: RunConfig, env_name: str, repeats: int) -> dict[str, float]:
    """Success of scripted policies on the validation instances of ``env_name`` (the config's ``eval`` seeds and
    interaction limits): random moves, the bootstrap's teacher mix (when it is one) and the teacher alone."""
    env = make_env(env_name, **config.env.options)
    policies: dict[str, Any] = {"random": get_scripted_policy("random")}
    if has_teacher(env):
        if config.bootstrap.policy == "teacher_mix":
            prob = config.bootstrap.teacher_prob
            policies[f"teacher mix p={prob:g}"] = get_scripted_policy("teacher_mix", teacher_prob=prob)
        policies["teacher"] = get_scripted_policy("teacher_mix", teacher_prob=1.0)
    seeds = validation_seeds(config, env_name)
    limits = (config.env.max_turns, config.env.max_actions_per_turn, config.env.max_actions_per_traj)
    levels = {}
    for label, policy in policies.items():
        rng = np.random.default_rng(derive_seed(0, "references", label))
        wins = []
        for _ in range(repeats):
            for seed in seeds:
                env.reset(seed)
                wins.append(play_scripted(env, policy, rng, limits, config.rollout.enable_think))
        levels[label] = float(np.mean(wins))
    return levels


def lift(first: float | None, final: float | None, episodes: int, min_lift: float) -> dict[str, Any]:
    """One run's lift from ``first`` to ``final`` validation success over ``episodes`` each, and whether it counts."""
    if first is None or final is None:
        return {"first": first, "final": final, "lift": None, "se": None, "lifted": False}
    se = math.sqrt((first * (1 - first) + final * (1 - final)) / episodes)
    gain = final - first
    return {"first": first, "final": final, "lift": gain, "se": se, "lifted": gain >= min_lift and gain > 2 * se}


PERCEPTION_QUERY = """
    SELECT run_id, iteration, avg(json_extract(info, '$.think_right')::BOOLEAN::INT) AS value FROM turns
    WHERE list_contains($runs, run_id) AND split = 'val' AND env = $env
      AND json_extract(info, '$.think_right') IS NOT NULL
    GROUP BY run_id, iteration ORDER BY run_id, iteration
"""


def perception(ctx: Context, arm: Arm, env_name: str) -> dict[str, list[tuple[int, float]]]:
    """Per run, ``(iteration, think right)`` at each validation: the share of the validation turns whose thinking is
    the state's description, read from the ``turns`` table (the engine's per-turn ``think_right``), so runs stored
    before the ``val/<env>/think_right`` metric existed are measured too (run ids and env are bound parameters)."""
    rows = query(ctx.lake, PERCEPTION_QUERY, params={"runs": list(arm.run_ids), "env": env_name}).to_pylist()
    series: dict[str, list[tuple[int, float]]] = {run: [] for run in arm.run_ids}
    for row in rows:
        series[row["run_id"]].append((int(row["iteration"]), float(row["value"])))
    return series


def _perception_curve(series: dict[str, list[tuple[int, float]]]) -> list[dict[str, Any]]:
    by_iteration: dict[int, list[float]] = {}
    for points in series.values():
        for iteration, value in points:
            by_iteration.setdefault(iteration, []).append(value)
    return [{"iteration": i, **spread(v)} for i, v in sorted(by_iteration.items())]


def arm_lifts(ctx: Context, arm: Arm, min_lift: float) -> dict[str, Any]:
    """An arm's validation success before and after RL: its env, each run's :func:`lift`, how many lifted and the
    verdict ("reproduced" when every run lifts, "partly" when some do, "not reproduced" when none does), and the
    spreads of the first, final and lift values over its runs (the head of an arm's numbers)."""
    config = arm.config
    if config is None:
        raise ValueError(f"arm {arm.label!r} has no config: arms come from a finding's sweep plans (arms_of)")
    env_name = config.env.name
    key = f"val/{env_name}/success"
    episodes = config.eval.instances * config.eval.k
    runs = {
        run: lift(first_value(ctx, run, key), last_value(ctx, run, key), episodes, min_lift) for run in arm.run_ids
    }
    lifted = sum(r["lifted"] for r in runs.values())
    verdict = "reproduced" if lifted == len(runs) and runs else "partly" if lifted else "not reproduced"
    return {
        "env": env_name,
        "env_options": dict(config.env.options),
        "val_key": key,
        "episodes": episodes,
        "verdict": verdict,
        "lifted_runs": lifted,
        "runs": runs,
        "val_success_first": spread([r["first"] for r in runs.values()]),
        "val_success_final": spread([r["final"] for r in runs.values()]),
        "lift": spread([r["lift"] for r in runs.values()]),
    }


def _arm(ctx: Context, arm: Arm, repeats: int, min_lift: float) -> dict[str, Any]:
    head = arm_lifts(ctx, arm, min_lift)
    config, env_name, key = arm.config, head["env"], head["val_key"]
    names = (key, f"val/{env_name}/{AGREEMENT}", f"val/{env_name}/{CHANCE}", f"val/{env_name}/{PERCEPTION}")
    seen = perception(ctx, arm, env_name)
    overlap = validation_overlap(ctx, arm, env_name)
    return {
        **head,
        "agreement_first": spread([first_value(ctx, run, names[1]) for run in arm.run_ids]),
        "agreement_final": spread([last_value(ctx, run, names[1]) for run in arm.run_ids]),
        "chance": spread([first_value(ctx, run, names[2]) for run in arm.run_ids]),
        "think_right_first": spread([points[0][1] if points else None for points in seen.values()]),
        "think_right_final": spread([points[-1][1] if points else None for points in seen.values()]),
        "held_out": config.eval.held_out,
        "val_seen_in_training": spread([o["seen"] / o["maps"] for o in overlap.values() if o["maps"]]),
        "references": reference_levels(config, env_name, repeats),
        "curves": {**{name: curve(ctx, arm, name) for name in names[:3]}, names[3]: _perception_curve(seen)},
    }


@register("multiturn")
def multiturn(ctx: Context) -> dict[str, Any]:
    """Per arm: the verdict, each run's lift and its standard error, the teacher agreement before and after RL
    against chance, the measured reference levels and the curves (module docstring)."""
    repeats = int(ctx.params.get("reference_repeats", 4))
    min_lift = float(ctx.params.get("min_lift", 0.08))
    arms = {arm.label: _arm(ctx, arm, repeats, min_lift) for arm in ctx.arms}
    return {"min_lift": min_lift, "arms": arms}
