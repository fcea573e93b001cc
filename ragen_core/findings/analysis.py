"""The numbers of each finding, read from the finished runs in the lake (DuckDB over the ``metrics``, ``events`` and
``turns`` tables); every result is a JSON-able dict with the mean and spread over seeds.

Spread over seeds (:func:`spread`): mean, sample standard deviation (0 for one seed), min, max and the number of
runs. A curve is one such summary per iteration. "Training success" is ``rollout/success_rate`` (every iteration),
"validation success" ``val/<env>/success`` (iteration 0 = before RL, then every ``eval.every``, and the last).

Collapse (:func:`collapse_iteration`), defined on training success because it is measured every iteration: the
first iteration at which either (a) the trailing mean of training success over ``window`` iterations has fallen at
least ``collapse_drop`` below its highest earlier value (trailing means from the ``window``-th iteration on), or (b)
the first of ``window`` consecutive iterations at which the in-group reward std is 0 (every group answers alike)
and training success is below ``monitor.converged_success``, after the std was positive at an earlier iteration (a
policy that stopped exploring without solving the task).
A run without such an iteration is healthy (a run that never explored, e.g. one that never learned the format, too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ragen_core.config import RunConfig, stored_config
from ragen_core.findings.spec import FindingSpec, VariantPlan
from ragen_core.monitor.metrics import collapse_warnings
from ragen_core.registry import Registry
from ragen_core.storage import DataLake, query

SUCCESS, GROUP_STD, ENTROPY, GRAD = (
    "rollout/success_rate",
    "rollout/in_group_reward_std",
    "actor/entropy",
    "actor/grad_norm_max",
)
DERIVED_TIMES = ("time/generate_tokens_per_s", "time/update_tokens_per_s")  # rates, not stage durations


@dataclass(frozen=True)
class Arm:
    """The runs of one setting (a variant x one grid combination), one per seed."""

    label: str
    variant: str
    overrides: list[str]
    run_ids: list[str]
    config: RunConfig | None = None  # the resolved config of its first point (its env, eval settings)


@dataclass
class Context:
    """What an analysis reads: the lake, the arms, every metric row of their runs, and the spec's parameters."""

    lake: DataLake
    arms: list[Arm]
    metrics: pd.DataFrame  # run_id, iteration, name, value
    params: dict[str, Any]
    val_env: str
    config: dict[str, Any]  # the first point's resolved config (monitor thresholds, eval settings)
    overlaps: dict[tuple[str, str], dict[str, dict[str, int]]] = field(default_factory=dict, repr=False)  # read once

    def series(self, run_id: str, name: str) -> list[tuple[int, float]]:
        """(iteration, value) of one metric of one run, by iteration."""
        rows = self.metrics[(self.metrics["run_id"] == run_id) & (self.metrics["name"] == name)]
        return [(int(i), float(v)) for i, v in zip(rows["iteration"], rows["value"], strict=True)]

    @property
    def val_key(self) -> str:
        return f"val/{self.val_env}/success"


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Mean, sample std (0 for one value), min, max and count of the finite ``values`` (None when there are none)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0
    return {"mean": float(np.mean(finite)), "std": std, "min": min(finite), "max": max(finite), "n": len(finite)}


def arms_of(plans: list[VariantPlan]) -> list[Arm]:
    """Group each sweep's points by their overrides without the seed: one arm per variant x grid combination."""
    arms: dict[str, Arm] = {}
    for item in plans:
        for point in item.plan.points:
            setting = [o for o in point.overrides if not o.startswith("seed=")]
            label = " ".join([item.variant.name, *setting]) if len(plans) > 1 or not setting else " ".join(setting)
            arm = arms.setdefault(label, Arm(label, item.variant.name, setting, [], point.config))
            arm.run_ids.append(point.run_id)
    return list(arms.values())


def load_context(lake: DataLake, spec: FindingSpec, plans: list[VariantPlan]) -> Context:
    """Every metric row of the finding's runs (one query; run ids are a bound parameter, never SQL text)."""
    arms = arms_of(plans)
    run_ids = [run for arm in arms for run in arm.run_ids]
    frame = query(
        lake,
        "SELECT run_id, iteration, name, value FROM metrics WHERE list_contains($runs, run_id) "
        "ORDER BY run_id, iteration, name",
        params={"runs": run_ids},
    ).to_pandas()
    config = plans[0].plan.points[0].config.to_dict()
    val_env = str(spec.params.get("val_env", config["env"]["name"]))
    return Context(lake, arms, frame, dict(spec.params), val_env, config)


OVERLAP_QUERY = """
    WITH sources AS (
        SELECT run_id, run_id AS source FROM runs WHERE list_contains($runs, run_id)
        UNION ALL
        SELECT r.run_id, b.run_id FROM runs r JOIN runs b ON b.model_dir = r.model_dir AND b.kind = 'bootstrap'
        WHERE list_contains($runs, r.run_id)),
    val AS (SELECT DISTINCT run_id, observation FROM turns
            WHERE list_contains($runs, run_id) AND split = 'val' AND env = $env AND turn_index = 0),
    seen AS (SELECT DISTINCT s.run_id, t.observation FROM turns t JOIN sources s ON t.run_id = s.source
             WHERE t.split = 'train' AND t.env = $env AND t.turn_index = 0)
    SELECT val.run_id, count(*) AS maps, count(seen.observation) AS seen
    FROM val LEFT JOIN seen USING (run_id, observation) GROUP BY val.run_id
"""


def validation_overlap(ctx: Context, arm: Arm, env_name: str) -> dict[str, dict[str, int]]:
    """Per run, how many of its distinct validation instances (their first state, as shown) it also met in training
    or in its bootstrap's demonstrations (the bootstrap run that built its start model): 0 when validation holds out
    maps (``eval.held_out=maps``); measured from the lake, so runs stored before are measured too."""
    key = (arm.label, env_name)
    if key not in ctx.overlaps:  # the analysis and the held-out report both ask: one query per arm and env
        rows = query(ctx.lake, OVERLAP_QUERY, params={"runs": list(arm.run_ids), "env": env_name}).to_pylist()
        ctx.overlaps[key] = {row["run_id"]: {"maps": int(row["maps"]), "seen": int(row["seen"])} for row in rows}
    return ctx.overlaps[key]


def held_out_report(ctx: Context) -> dict[str, Any]:
    """Per arm whose validation env draws maps (Sokoban, FrozenLake): what its config held out (``eval.held_out``)
    and the measured share of each run's validation instances met in its training or bootstrap
    (:func:`validation_overlap`); empty for a finding whose envs draw no maps."""
    from ragen_core.envs.held_out import holds_out_maps

    report = {}
    for arm in ctx.arms:
        config = arm.config
        if config is None:
            continue
        for env_name in config.env.validation_envs:
            if not holds_out_maps(env_name, dict(config.env.options)):
                continue
            overlap = validation_overlap(ctx, arm, env_name)
            shares = [o["seen"] / o["maps"] for o in overlap.values() if o["maps"]]
            report[f"{arm.label} / {env_name}"] = {
                "held_out": config.eval.held_out,
                "val_seen_in_training": spread(shares),
            }
    return report


def curve(ctx: Context, arm: Arm, name: str) -> list[dict[str, Any]]:
    """Per iteration, the spread over the arm's runs of metric ``name``."""
    by_iteration: dict[int, list[float]] = {}
    for run_id in arm.run_ids:
        for iteration, value in ctx.series(run_id, name):
            by_iteration.setdefault(iteration, []).append(value)
    return [{"iteration": i, **spread(v)} for i, v in sorted(by_iteration.items())]


def last_value(ctx: Context, run_id: str, name: str) -> float | None:
    points = ctx.series(run_id, name)
    return points[-1][1] if points else None


def first_value(ctx: Context, run_id: str, name: str) -> float | None:
    points = ctx.series(run_id, name)
    return points[0][1] if points else None


def collapse_iteration(
    success: list[tuple[int, float]], group_std: list[tuple[int, float]], drop: float, converged: float, window: int
) -> int | None:
    """The collapse iteration of one run (module docstring), or None for a healthy run."""
    stds = dict(group_std)
    peak, explored, stuck = -math.inf, False, []
    for position, (iteration, value) in enumerate(success):
        trailing = float(np.mean([v for _, v in success[max(0, position - window + 1) : position + 1]]))
        if position >= window and trailing <= peak - drop:
            return iteration
        stuck = [*stuck, iteration] if explored and stds.get(iteration, 1.0) == 0.0 and value < converged else []
        if len(stuck) >= window:
            return stuck[0]
        explored = explored or stds.get(iteration, 0.0) > 0.0
        if position >= window - 1:
            peak = max(peak, trailing)
    return None


def run_collapse(ctx: Context, run_id: str) -> int | None:
    """:func:`collapse_iteration` of ``run_id`` with the spec's parameters."""
    return collapse_iteration(
        ctx.series(run_id, SUCCESS),
        ctx.series(run_id, GROUP_STD),
        float(ctx.params.get("collapse_drop", 0.25)),
        float(ctx.config["monitor"]["converged_success"]),
        int(ctx.params.get("collapse_window", 3)),
    )


def _validation(ctx: Context, arm: Arm) -> dict[str, Any]:
    return {
        "val_success_first": spread([first_value(ctx, r, ctx.val_key) for r in arm.run_ids]),
        "val_success_final": spread([last_value(ctx, r, ctx.val_key) for r in arm.run_ids]),
        "val_success_peak": spread([_peak(ctx.series(r, ctx.val_key)) for r in arm.run_ids]),
    }


def _peak(points: list[tuple[int, float]]) -> float | None:
    return max((v for _, v in points), default=None)


def learning(ctx: Context) -> dict[str, Any]:
    """Validation success before RL and at the end, per arm, with the spec's reference levels (params.references)."""
    arms = {arm.label: {**_validation(ctx, arm), "runs": arm.run_ids} for arm in ctx.arms}
    return {
        "val_env": ctx.val_env,
        "references": ctx.params.get("references", {}),
        "arms": arms,
        "curves": {arm.label: {ctx.val_key: curve(ctx, arm, ctx.val_key)} for arm in ctx.arms},
    }


ECHO_CURVES = (SUCCESS, GROUP_STD, ENTROPY)


def echo_trap(ctx: Context) -> dict[str, Any]:
    """Per arm: validation success (first, final, peak), collapsed runs and their collapse iterations, and the
    curves of validation and training success, in-group reward std and entropy."""
    arms = {}
    for arm in ctx.arms:
        collapses = {run: run_collapse(ctx, run) for run in arm.run_ids}
        arms[arm.label] = {
            **_validation(ctx, arm),
            "collapsed_runs": sum(c is not None for c in collapses.values()),
            "runs": len(arm.run_ids),
            "collapse_iteration": collapses,
        }
    curves = {arm.label: {name: curve(ctx, arm, name) for name in (ctx.val_key, *ECHO_CURVES)} for arm in ctx.arms}
    return {"val_env": ctx.val_env, "collapse_definition": _collapse_text(ctx), "arms": arms, "curves": curves}


def _collapse_text(ctx: Context) -> str:
    return (
        f"first iteration where the {ctx.params.get('collapse_window', 3)}-iteration trailing mean of training "
        f"success is >= {ctx.params.get('collapse_drop', 0.25)} below its earlier peak, or in-group reward std is "
        f"0 for {ctx.params.get('collapse_window', 3)} iterations in a row (after being positive) while training "
        f"success < {ctx.config['monitor']['converged_success']} (the first of them)"
    )


Analysis = Callable[[Context], dict[str, Any]]
ANALYSES: Registry[Analysis] = Registry("findings analysis", {"learning": learning, "echo_trap": echo_trap})
register = ANALYSES.register  # ``@register("name")`` adds an analysis (ragen_core/findings/studies.py)


def history(ctx: Context, run_id: str) -> list[tuple[int, dict[str, float]]]:
    """The run's metrics per iteration, oldest first (what its early-warning monitor saw)."""
    rows = ctx.metrics[ctx.metrics["run_id"] == run_id]
    grouped = rows.groupby("iteration")
    return [(int(i), dict(zip(g["name"], g["value"].astype(float), strict=True))) for i, g in grouped]


AS_RUN = "as run"  # replay_warnings' slip: the run's own monitor.success_slip


def replay_warnings(
    ctx: Context, run_id: str, drop: float, spike: float, slip: float | None | str = AS_RUN
) -> list[tuple[int, str]]:
    """(iteration, metric) of every collapse warning the monitor would give on the stored metrics of ``run_id`` with
    both drop thresholds ``drop``, the gradient spike factor ``spike`` and the success slip ``slip`` (None: signals
    alone; by default the run's; warmup and convergence: the run's)."""
    monitor, fired, past = stored_config(ctx.config)["monitor"], [], []
    slip = monitor["success_slip"] if slip == AS_RUN else slip
    for iteration, metrics in history(ctx, run_id):
        for warning in collapse_warnings(
            past, metrics, monitor["warmup"], drop, drop, spike, monitor["converged_success"], slip
        ):
            fired.append((iteration, warning.metric))
        past.append(metrics)
    return fired


def recorded_warnings(ctx: Context, run_ids: list[str]) -> dict[str, list[tuple[int, str]]]:
    """(iteration, metric) of the ``early_warning`` events each run recorded, by iteration."""
    rows = query(
        ctx.lake,
        "SELECT run_id, iteration, metric FROM events WHERE kind = 'early_warning' AND "
        "list_contains($runs, run_id) ORDER BY run_id, iteration, metric",
        params={"runs": run_ids},
    ).to_pylist()
    found: dict[str, list[tuple[int, str]]] = {run: [] for run in run_ids}
    for row in rows:
        found[row["run_id"]].append((int(row["iteration"]), str(row["metric"])))
    return found
