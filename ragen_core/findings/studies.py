"""The analyses beyond learning and the Echo Trap: early warnings, filtering, rollout diversity, reasoning."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ragen_core.config import stored_config
from ragen_core.findings.analysis import (
    ENTROPY,
    GRAD,
    GROUP_STD,
    SUCCESS,
    Context,
    _validation,
    curve,
    history,
    recorded_warnings,
    register,
    replay_warnings,
    run_collapse,
    spread,
)
from ragen_core.storage import query

SIGNALS = (GROUP_STD, ENTROPY, GRAD)
TOKENS = "actor/trained_tokens"
STEP = "time/step"  # wall seconds from one commit to the next (ragen_core.run.stages.step_time)


def _leads(warnings: dict[str, list[tuple[int, str]]], collapses: dict[str, int | None]) -> dict[str, Any]:
    """Detection on collapsing runs (a warning at or before the collapse; lead = collapse - first such warning) and
    false alarms on healthy runs (any warning)."""
    collapsing = [r for r, c in collapses.items() if c is not None]
    healthy = [r for r, c in collapses.items() if c is None]
    leads = {}
    for run in collapsing:
        ahead = [i for i, _ in warnings[run] if i <= collapses[run]]
        leads[run] = collapses[run] - min(ahead) if ahead else None
    alarms = {run: len(warnings[run]) for run in healthy}
    return {
        "collapsing_runs": len(collapsing),
        "healthy_runs": len(healthy),
        "detected": sum(v is not None for v in leads.values()),
        "lead_iterations": leads,
        "lead": spread([v for v in leads.values() if v is not None]),
        "false_alarm_runs": sum(n > 0 for n in alarms.values()),
        "false_alarm_rate": (sum(n > 0 for n in alarms.values()) / len(healthy)) if healthy else None,
        "warnings_on_healthy_runs": alarms,
    }


@register("early_warnings")
def early_warnings(ctx: Context) -> dict[str, Any]:
    """How many iterations ahead the run's own early warnings (``events``) came on collapsing runs, per signal and
    any; how often they fired on healthy runs; and the same for a grid of thresholds replayed on the stored metrics
    (``params.calibration``: drops for both reward std and entropy, gradient spike factors, success slips: null for
    the signals alone)."""
    runs = [run for arm in ctx.arms for run in arm.run_ids]
    collapses = {run: run_collapse(ctx, run) for run in runs}
    recorded = recorded_warnings(ctx, runs)
    per_signal = {
        name: _leads({r: [w for w in ws if w[1] == name] for r, ws in recorded.items()}, collapses) for name in SIGNALS
    }
    grid = ctx.params.get("calibration", {"drop": [0.3, 0.5, 0.7], "spike": [3.0, 5.0, 10.0], "slip": [None]})
    settings = []
    for drop, spike, slip in itertools.product(grid["drop"], grid["spike"], grid.get("slip", [None])):
        result = _leads({r: replay_warnings(ctx, r, drop, spike, slip) for r in runs}, collapses)
        settings.append({"drop": drop, "spike": spike, "slip": slip, **result})
    best = max(settings, key=_score, default=None)
    monitor = stored_config(ctx.config)["monitor"]
    return {
        "collapse_iteration": collapses,
        "as_run": {
            "reward_std_drop": monitor["reward_std_drop"],
            "entropy_drop": monitor["entropy_drop"],
            "grad_norm_spike": monitor["grad_norm_spike"],
            "success_slip": monitor["success_slip"],
            **_leads(recorded, collapses),
        },
        "per_signal": per_signal,
        "calibration": settings,
        "calibrated": best,
        "curves": {arm.label: {n: curve(ctx, arm, n) for n in (SUCCESS, *SIGNALS)} for arm in ctx.arms},
        "run_curves": {
            arm.label: {run: {n: ctx.series(run, n) for n in (SUCCESS, *SIGNALS)} for run in arm.run_ids}
            for arm in ctx.arms
        },
        "warnings": recorded,
    }


def _score(setting: dict[str, Any]) -> tuple[float, float]:
    """Detection rate minus false-alarm rate, then the mean lead: what the calibration maximises."""
    detection = setting["detected"] / setting["collapsing_runs"] if setting["collapsing_runs"] else 0.0
    return detection - (setting["false_alarm_rate"] or 0.0), setting["lead"]["mean"] or 0.0


def _stage_seconds(metrics: dict[str, float]) -> float:
    """The seconds of an iteration's stages: its ``time/<stage>`` metrics (not the rates, nor ``time/step``, the
    commit-to-commit wall time that already holds them)."""
    return sum(v for k, v in metrics.items() if k.startswith("time/") and not k.endswith("_per_s") and k != STEP)


def _mean_over_training(ctx: Context, run_id: str, name: str) -> float | None:
    values = [v for i, v in ctx.series(run_id, name) if i >= 0]
    return float(np.mean(values)) if values else None


def _wall_seconds(ctx: Context, run_id: str) -> float:
    """Seconds the run's stages took, summed over its iterations (time/<stage> metrics; start-up not included)."""
    return float(sum(_stage_seconds(m) for _, m in history(ctx, run_id)))


@register("filtering")
def filtering(ctx: Context) -> dict[str, Any]:
    """Per arm (keep ratio): update tokens per iteration (actor/trained_tokens), update seconds per iteration
    (time/update), stage seconds per iteration (all time/<stage>), and validation success."""
    arms = {}
    for arm in ctx.arms:
        runs = arm.run_ids
        per_iteration = [_wall_seconds(ctx, r) / max(len(history(ctx, r)), 1) for r in runs]
        arms[arm.label] = {
            "trained_tokens_per_iteration": spread([_mean_over_training(ctx, r, TOKENS) for r in runs]),
            "update_seconds_per_iteration": spread([_mean_over_training(ctx, r, "time/update") for r in runs]),
            "seconds_per_iteration": spread(per_iteration),
            **_validation(ctx, arm),
        }
    curves = {
        arm.label: {n: curve(ctx, arm, n) for n in (ctx.val_key, "actor/trained_tokens", "time/update")}
        for arm in ctx.arms
    }
    return {"val_env": ctx.val_env, "arms": arms, "curves": curves}


@register("diversity")
def diversity(ctx: Context) -> dict[str, Any]:
    """Per arm (group size x Online-k): validation success, stage minutes of the run, and success per minute =
    (final - first validation success) / minutes."""
    arms = {}
    for arm in ctx.arms:
        minutes = [_wall_seconds(ctx, r) / 60.0 for r in arm.run_ids]
        gains = []
        for run, minute in zip(arm.run_ids, minutes, strict=True):
            series = ctx.series(run, ctx.val_key)
            gains.append((series[-1][1] - series[0][1]) / minute if series and minute > 0 else None)
        arms[arm.label] = {
            **_validation(ctx, arm),
            "minutes": spread(minutes),
            "success_gain_per_minute": spread(gains),
        }
    curves = {arm.label: {ctx.val_key: curve(ctx, arm, ctx.val_key)} for arm in ctx.arms}
    return {"val_env": ctx.val_env, "arms": arms, "curves": curves}


THINK_SQL = """
SELECT run_id, iteration,
       avg(CASE WHEN trim(coalesce(think, '')) = '' THEN 0
                ELSE len(string_split(regexp_replace(trim(think), '\\s+', ' ', 'g'), ' ')) END) AS think_words,
       avg(CASE WHEN format_ok THEN 1.0 ELSE 0.0 END) AS format_ok_rate
FROM turns WHERE split = 'train' AND list_contains($runs, run_id)
GROUP BY ALL ORDER BY ALL
"""


@register("reasoning")
def reasoning(ctx: Context) -> dict[str, Any]:
    """Per arm (with / without the format penalty): think length in words per training turn and the share of
    distinct think texts per group (rollout/think_distinct_rate) over iterations, format-ok rate, val success."""
    runs = [run for arm in ctx.arms for run in arm.run_ids]
    rows = query(ctx.lake, THINK_SQL, params={"runs": runs}).to_pylist()
    arms, curves = {}, {}
    for arm in ctx.arms:
        words: dict[int, list[float]] = {}
        formats: dict[int, list[float]] = {}
        for row in (r for r in rows if r["run_id"] in arm.run_ids):
            words.setdefault(row["iteration"], []).append(row["think_words"])
            formats.setdefault(row["iteration"], []).append(row["format_ok_rate"])
        last = max(words, default=None)
        curves[arm.label] = {
            "think_words": [{"iteration": i, **spread(v)} for i, v in sorted(words.items())],
            "rollout/think_distinct_rate": curve(ctx, arm, "rollout/think_distinct_rate"),
            "format_ok_rate": [{"iteration": i, **spread(v)} for i, v in sorted(formats.items())],
            ctx.val_key: curve(ctx, arm, ctx.val_key),
        }
        arms[arm.label] = {
            "think_words_first": spread(words.get(min(words, default=-1), [])),
            "think_words_last": spread(words.get(last, [])),
            "think_distinct_first": spread([_first(ctx, r) for r in arm.run_ids]),
            "think_distinct_last": spread([_last(ctx, r) for r in arm.run_ids]),
            **_validation(ctx, arm),
        }
    return {"val_env": ctx.val_env, "arms": arms, "curves": curves}


def _first(ctx: Context, run_id: str) -> float | None:
    points = ctx.series(run_id, "rollout/think_distinct_rate")
    return points[0][1] if points else None


def _last(ctx: Context, run_id: str) -> float | None:
    points = ctx.series(run_id, "rollout/think_distinct_rate")
    return points[-1][1] if points else None


STALENESS_SQL = """
SELECT run_id, avg(iteration - policy_version) AS mean_staleness, max(iteration - policy_version) AS max_staleness
FROM trajectories WHERE split = 'train' AND list_contains($runs, run_id) GROUP BY run_id
"""


def _wall_minutes(ctx: Context, run_id: str) -> float | None:
    """Wall minutes from the run's first commit to its last (the sum of its ``time/step``: the iterations' overlap
    counted once); None without them (a run older than the metric, or one resumed at every iteration)."""
    steps = [v for _, v in ctx.series(run_id, STEP)]
    return sum(steps) / 60.0 if steps else None


def mark_within_spread(ctx: Context, arms: dict[str, dict[str, Any]], variant: str, key: str) -> None:
    """With an arm of ``variant`` (the reference), each arm's ``key``: whether its mean final validation success lies
    within the reference arm's min..max over seeds (None where a number is missing)."""
    reference = next((a for a in ctx.arms if a.variant == variant), None)
    if reference is None:
        return
    low, high = (arms[reference.label]["val_success_final"][k] for k in ("min", "max"))
    for numbers in arms.values():
        mean = numbers["val_success_final"]["mean"]
        numbers[key] = None if None in (mean, low, high) else bool(low <= mean <= high)


@register("async_staleness")
def async_staleness(ctx: Context) -> dict[str, Any]:
    """Per arm (``trainer.max_staleness``): validation success before RL and at the end (held-out instances for the
    map envs), the wall minutes from the first commit to the last (``time/step``), seconds per iteration, the success
    gained per wall minute = (final - first validation success) / wall minutes, and the staleness its training
    batches had (iteration - the policy version that sampled them: mean and largest over the seeds' runs). With a
    ``sync`` arm, each arm's final success against the sync arm's spread over seeds (``within_sync_spread``: within
    its min..max)."""
    runs = [run for arm in ctx.arms for run in arm.run_ids]
    staleness = {r["run_id"]: r for r in query(ctx.lake, STALENESS_SQL, params={"runs": runs}).to_pylist()}
    arms = {}
    for arm in ctx.arms:
        minutes = [_wall_minutes(ctx, r) for r in arm.run_ids]
        per_iteration = [
            (m * 60.0 / len(ctx.series(r, STEP))) if m else None for r, m in zip(arm.run_ids, minutes, strict=True)
        ]
        gains = []
        for run, minute in zip(arm.run_ids, minutes, strict=True):
            series = ctx.series(run, ctx.val_key)
            gains.append((series[-1][1] - series[0][1]) / minute if series and minute else None)
        arms[arm.label] = {
            **_validation(ctx, arm),
            "wall_minutes": spread(minutes),
            "seconds_per_iteration": spread(per_iteration),
            "success_gain_per_minute": spread(gains),
            "staleness_mean": spread([staleness.get(r, {}).get("mean_staleness") for r in arm.run_ids]),
            "staleness_max": max((staleness.get(r, {}).get("max_staleness") or 0 for r in arm.run_ids), default=0),
        }
    mark_within_spread(ctx, arms, "sync", "within_sync_spread")
    curves = {arm.label: {ctx.val_key: curve(ctx, arm, ctx.val_key), STEP: curve(ctx, arm, STEP)} for arm in ctx.arms}
    return {"val_env": ctx.val_env, "arms": arms, "curves": curves}
