"""One PNG per finding: curves over iterations (mean over seeds, shaded min..max) and bars per arm (mean, std error
bars), drawn with matplotlib's Agg canvas (no display, no pyplot state) and written atomically."""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any

from ragen_core.registry import Registry
from ragen_core.storage.files import atomic_write_bytes

SUCCESS_KEY = "rollout/success_rate"
VAL = "val"  # stands for val/<val_env>/success in the panel lists below
TITLES = {
    VAL: "Validation success",
    "rollout/success_rate": "Training success",
    "rollout/in_group_reward_std": "In-group reward std",
    "actor/entropy": "Token entropy",
    "actor/grad_norm_max": "Gradient norm (max)",
    "actor/trained_tokens": "Update tokens per iteration",
    "time/update": "Update seconds per iteration",
    "think_words": "Think length (words per turn)",
    "rollout/think_distinct_rate": "Distinct think texts per group (share)",
    "format_ok_rate": "Format-ok rate",
    "val_success_first": "Validation success before RL",
    "val_success_final": "Final validation success",
    "trained_tokens_per_iteration": "Update tokens / iteration",
    "update_seconds_per_iteration": "Update s / iter",
    "seconds_per_iteration": "Stage seconds / iteration",
    "minutes": "Run minutes (stages)",
    "success_gain_per_minute": "Validation success gain per minute",
    "time/step": "Wall seconds per iteration",
    "wall_minutes": "Run minutes (wall, first to last commit)",
    "staleness_mean": "Batch staleness (mean)",
}
Panels = tuple[tuple[str, ...], tuple[str, ...]]  # (curve panels, bar panels)
PANELS: Registry[Panels] = Registry(
    "findings figure",
    {  # analysis -> its panels
        "learning": ((VAL,), ("val_success_first", "val_success_final")),
        "echo_trap": ((VAL, "rollout/success_rate", "rollout/in_group_reward_std", "actor/entropy"), ()),
        "early_warnings": (
            ("rollout/success_rate", "rollout/in_group_reward_std", "actor/entropy", "actor/grad_norm_max"),
            (),
        ),
        "filtering": (
            (VAL,),
            (
                "trained_tokens_per_iteration",
                "update_seconds_per_iteration",
                "seconds_per_iteration",
                "val_success_final",
            ),
        ),
        "diversity": ((VAL,), ("val_success_final", "minutes", "success_gain_per_minute")),
        "reasoning": (("think_words", "rollout/think_distinct_rate", "format_ok_rate", VAL), ()),
        "async_staleness": (
            (VAL, "time/step"),
            ("val_success_final", "wall_minutes", "success_gain_per_minute", "staleness_mean"),
        ),
    },
)


def _curve_panel(ax, result: dict[str, Any], key: str) -> None:
    name = f"val/{result.get('val_env')}/success" if key == VAL else key
    for index, (label, curves) in enumerate(result.get("curves", {}).items()):
        points = [p for p in curves.get(name, []) if p["mean"] is not None]
        if not points:
            continue
        x = [p["iteration"] for p in points]
        ax.plot(
            x,
            [p["mean"] for p in points],
            color=f"C{index % 10}",
            marker="o",
            markersize=3,
            label=label,
            gid=f"{label}|{name}",
        )
        ax.fill_between(x, [p["min"] for p in points], [p["max"] for p in points], color=f"C{index % 10}", alpha=0.2)
    if key == VAL:
        for index, (ref, level) in enumerate(result.get("references", {}).items()):
            ax.axhline(level, color="grey", linestyle=("--", ":", "-.")[index % 3], label=f"{ref} {level:g}")
    ax.set_title(TITLES.get(key, key))
    ax.set_xlabel("iteration")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="x-small")


def _run_panel(ax, numbers: dict[str, Any], key: str) -> None:
    """Early warnings: one line per run (colour: its arm), an x at its collapse, a triangle at each warning about
    this metric (or any warning, on the training-success panel)."""
    for index, (label, runs) in enumerate(numbers.get("run_curves", {}).items()):
        for number, (run, series) in enumerate(runs.items()):
            points = dict(series.get(key, []))
            if not points:
                continue
            colour = f"C{index % 10}"
            ax.plot(
                list(points),
                list(points.values()),
                color=colour,
                linewidth=1,
                alpha=0.8,
                label=label if number == 0 else None,
                gid=f"{run}|{key}",
            )
            collapse = numbers.get("collapse_iteration", {}).get(run)
            if collapse in points:
                ax.plot([collapse], [points[collapse]], "x", color=colour, markersize=9, markeredgewidth=2)
            warned = {i for i, metric in numbers.get("warnings", {}).get(run, []) if key in (metric, SUCCESS_KEY)}
            marks = [i for i in sorted(warned) if i in points]
            ax.plot(marks, [points[i] for i in marks], "v", color=colour, markersize=6, linestyle="none")
    ax.set_title(f"{TITLES.get(key, key)}, per run (x collapse, v warning)")
    ax.set_xlabel("iteration")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="x-small")


def _bar_panel(ax, result: dict[str, Any], key: str) -> None:
    labels, means, errors = [], [], []
    for label, numbers in result.get("arms", {}).items():
        value = numbers.get(key) or {}
        labels.append(label)
        means.append(value.get("mean") if value.get("mean") is not None else math.nan)
        errors.append(value.get("std") or 0.0)
    ax.bar(range(len(labels)), means, yerr=errors, color=[f"C{i % 10}" for i in range(len(labels))], capsize=3)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize="x-small")
    ax.set_title(TITLES.get(key, key))
    ax.grid(True, axis="y", alpha=0.3)


def _calibration_panel(ax, result: dict[str, Any]) -> None:
    settings = result.get("calibration", [])
    labels = [
        f"d{s['drop']:g}/x{s['spike']:g}" + (f"/s{s['slip']:g}" if s.get("slip") is not None else "") for s in settings
    ]
    detection = [s["detected"] / s["collapsing_runs"] if s["collapsing_runs"] else math.nan for s in settings]
    alarms = [s["false_alarm_rate"] if s["false_alarm_rate"] is not None else math.nan for s in settings]
    positions = range(len(settings))
    ax.bar([p - 0.2 for p in positions], detection, width=0.4, label="detected before collapse (share)")
    ax.bar([p + 0.2 for p in positions], alarms, width=0.4, label="false alarms on healthy runs (share)")
    ax.set_xticks(list(positions), labels, rotation=45, ha="right", fontsize="x-small")
    ax.set_title("Detector calibration (drop / spike factor / success slip)")
    ax.legend(fontsize="x-small")


def _series_panel(ax, points: list[dict[str, Any]], label: str, colour: str, gid: str, style: str = "-") -> None:
    """Mean over seeds with the min..max band."""
    points = [p for p in points if p["mean"] is not None]
    if not points:
        return
    x = [p["iteration"] for p in points]
    ax.plot(
        x, [p["mean"] for p in points], color=colour, linestyle=style, marker="o", markersize=3, label=label, gid=gid
    )
    ax.fill_between(x, [p["min"] for p in points], [p["max"] for p in points], color=colour, alpha=0.15)


def _draw_multiturn(figure, numbers: dict[str, Any]) -> None:
    """One row per arm: validation success against the measured reference levels, and the teacher agreement
    against chance."""
    arms = numbers.get("arms", {})
    axes = figure.subplots(max(1, len(arms)), 2, squeeze=False)
    for row, (label, arm) in enumerate(arms.items()):
        left, right = axes[row]
        curves = arm["curves"]
        _series_panel(
            left,
            curves[arm["val_key"]],
            f"StarPO-S ({arm['lifted_runs']}/{len(arm['runs'])} lifted)",
            "C0",
            f"{label}|{arm['val_key']}",
        )
        for index, (ref, level) in enumerate(arm.get("references", {}).items()):
            left.axhline(level, color="grey", linestyle=("--", ":", "-.")[index % 3], label=f"{ref} {level:.2f}")
        left.set_title(f"{label}: validation success ({arm['verdict']})", fontsize="small")
        left.set_ylim(-0.02, 1.02)
        for key, colour, style in (
            ("teacher_agreement", "C1", "-"),
            ("teacher_chance", "C1", ":"),
            ("think_right", "C2", "--"),
        ):
            name = arm["val_key"].replace("/success", f"/{key}")
            _series_panel(right, curves.get(name, []), key.replace("_", " "), colour, f"{label}|{name}", style)
        right.set_title(f"{label}: agreement with the teacher's move, perception", fontsize="small")
        for ax in (left, right):
            ax.set_xlabel("iteration")
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize="x-small")


def _draw_tool_use(figure, numbers: dict[str, Any]) -> None:
    """One row per arm: validation success against the measured reference levels; the shares of the calls (the
    first call the teacher's, its tool, its shape; the literals copied from the question; malformed calls, episodes
    cut); tool calls per episode."""
    arms = numbers.get("arms", {})
    axes = figure.subplots(max(1, len(arms)), 3, squeeze=False)
    for row, (label, arm) in enumerate(arms.items()):
        left, middle, right = axes[row]
        curves = arm["curves"]
        lifted = f"StarPO-S ({arm['lifted_runs']}/{len(arm['runs'])} lifted)"
        _series_panel(left, curves[arm["val_key"]], lifted, "C0", f"{label}|{arm['val_key']}")
        for index, (ref, level) in enumerate(arm.get("references", {}).items()):
            left.axhline(level, color="grey", linestyle=("--", ":", "-.")[index % 3], label=f"{ref} {level:.2f}")
        left.set_title(f"{label}: validation success ({arm['verdict']})", fontsize="small")
        shares = (
            ("first_call_is_teacher", "C1", "-"),
            ("first_tool_is_teacher", "C1", ":"),
            ("first_shape_is_teacher", "C1", "--"),
            ("literals_from_question", "C4", "-"),
            ("malformed_share", "C3", "-"),
            ("truncated_share", "C3", ":"),
        )
        for key, colour, style in shares:
            _series_panel(middle, curves.get(key, []), key.replace("_", " "), colour, f"{label}|{key}", style)
        middle.set_title(f"{label}: the calls", fontsize="small")
        _series_panel(right, curves.get("calls_per_episode", []), "calls per episode", "C2", f"{label}|calls")
        right.set_title(f"{label}: tool calls per episode", fontsize="small")
        for ax in (left, middle):
            ax.set_ylim(-0.02, 1.02)
        for ax in (left, middle, right):
            ax.set_xlabel("iteration")
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize="x-small")


ROW_DRAWN = {"multiturn": (_draw_multiturn, 2), "tool_use": (_draw_tool_use, 3)}  # one row of panels per arm


def draw_finding(result: dict[str, Any], title: str):
    """The finding's figure (a matplotlib Figure on an Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if result["analysis"] in ROW_DRAWN:
        draw, columns = ROW_DRAWN[result["analysis"]]
        arms = len(result["numbers"].get("arms", {}))
        figure = Figure(figsize=(6.0 * columns, 3.2 * max(1, arms)), layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure, result["numbers"])
        figure.suptitle(textwrap.fill(title, 110), fontsize="medium")
        return figure

    curves, bars = PANELS[result["analysis"]]
    extra = 1 if result["analysis"] == "early_warnings" else 0
    count = len(curves) + len(bars) + extra
    columns = 2 if count > 1 else 1
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(6.0 * columns, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, key in zip(axes, curves, strict=False):
        (_run_panel if extra else _curve_panel)(ax, result["numbers"], key)
    for ax, key in zip(axes[len(curves) :], bars, strict=False):
        _bar_panel(ax, result["numbers"], key)
    if extra:
        _calibration_panel(axes[len(curves) + len(bars)], result["numbers"])
    for ax in axes[count:]:
        ax.set_visible(False)
    figure.suptitle(textwrap.fill(title, 110), fontsize="medium")
    return figure


def write_finding_png(result: dict[str, Any], title: str, out: Path) -> Path:
    """Draw the finding and write the PNG at ``out`` (atomically)."""
    buffer = io.BytesIO()
    draw_finding(result, title).savefig(buffer, format="png", dpi=90)
    atomic_write_bytes(Path(out), buffer.getvalue())
    return Path(out)
