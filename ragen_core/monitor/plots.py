"""Collapse-indicator plots of one or several runs, read from the ``metrics`` table, as one PNG.

One panel per indicator of the RAGEN paper's Echo Trap analysis: validation success per environment, rollout reward
mean and std, in-group reward std, token entropy, gradient norm and response length, plus RAGEN-2's input-reasoning
mutual information (``trainer.mi_diagnostic``; it falls under template collapse), and for envs with a teacher the
share of validation moves that agree with it against the share random moves would (the weak prior a bootstrap gives
and RL sharpens), against the iteration. One
colour per run; only the panels some run has data for are drawn (the figure's title names the others, "no data";
when no panel has data, every panel is drawn saying so). The figure is drawn with matplotlib's Agg canvas (no
display, no pyplot state) and written atomically.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_core.storage import DataLake
from ragen_core.storage.files import atomic_write_bytes
from ragen_core.storage.maintenance.housekeeping import runs_with_data

Points = list[tuple[int, float]]
SeriesKey = tuple[str, str]  # (run_id, metric name)
PanelData = dict[str, dict[SeriesKey, Points]]  # panel key -> series -> points sorted by iteration

VAL_METRIC = re.compile(r"^val/(?P<env>[^/]+)/(?P<metric>[^/]+)$")
ENV_STYLES = ("-", "--", ":", "-.")
NO_DATA = "no data"


class PlotError(ValueError):
    """The plot cannot be made from what was asked (unknown run, bad output path)."""


@dataclass(frozen=True)
class Panel:
    """One indicator: ``key`` is the metric name, or ``val/*/<metric>`` for that metric of every validation
    environment (``val/*/teacher_*``: the teacher agreement and its chance level)."""

    key: str
    title: str
    ylabel: str

    def matches(self, name: str) -> bool:
        """Whether metric ``name`` is drawn in this panel."""
        if not self.key.startswith("val/*/"):
            return name == self.key
        metric = self.key.removeprefix("val/*/")
        found = VAL_METRIC.match(name)
        if found is None:
            return False
        return found["metric"].startswith(metric[:-1]) if metric.endswith("*") else found["metric"] == metric


PANELS: tuple[Panel, ...] = (
    Panel("val/*/success", "Validation success", "success rate"),
    Panel("rollout/reward_mean", "Rollout reward (mean)", "reward"),
    Panel("rollout/reward_std", "Rollout reward std", "std"),
    Panel("rollout/in_group_reward_std", "In-group reward std", "std"),
    Panel("actor/entropy", "Token entropy", "entropy"),
    Panel("actor/grad_norm", "Gradient norm", "grad norm"),
    Panel("rollout/response_length", "Response length", "tokens"),
    Panel("diag/reasoning_mi_per_token", "Input-reasoning MI per token (template collapse)", "nats/token"),
    Panel("val/*/teacher_*", "Teacher agreement (validation) against chance", "share of moves"),
)


@dataclass
class PlotResult:
    """What :func:`plot_runs` wrote: the PNG's path, the plotted data and the matplotlib figure it drew."""

    path: Path
    data: PanelData
    figure: object  # matplotlib.figure.Figure (imported lazily)


def check_request(lake: DataLake, run_ids: Sequence[str], out: Path, force: bool = True) -> Path:
    """Refuse before reading anything: no runs, unknown runs, an output that is not a PNG, lies in the lake, is
    not a plain file (or exists, without ``force``). Returns the resolved output path."""
    if not run_ids:
        raise PlotError("give at least one run id; list the runs with `ragen runs`")
    known = runs_with_data(lake)
    unknown = [run for run in dict.fromkeys(run_ids) if run not in known]
    if unknown:
        raise PlotError(
            f"unknown run id(s) {', '.join(map(repr, unknown))} in {lake.root}; "
            f"list the runs with `ragen runs --data-root {lake.root}`"
        )
    return check_png_output(out, lake.root, force)


def check_png_output(out: str | Path, root: str | Path, force: bool = True) -> Path:
    """The resolved path of a picture to write: a .png file, not a folder, outside the data root ``root`` (which
    the command only reads), not a symbolic link nor a device, pipe or socket (replaced by a file, they would be
    lost), and, without ``force``, not an existing file. Raises :class:`PlotError` naming what is wrong."""
    given = Path(out).expanduser()
    if given.is_symlink():
        raise PlotError(f"the output {str(given)!r} is a symbolic link; give the path of a plain file")
    out, root = given.resolve(), Path(root).expanduser().resolve()
    if out.suffix.lower() != ".png":
        raise PlotError(f"the output {str(out)!r} must be a .png file")
    if out.is_relative_to(root):
        raise PlotError(
            f"the output {str(out)!r} lies inside the data root {str(root)!r}; the lake is read-only here: "
            "write elsewhere"
        )
    if out.is_dir():
        raise PlotError(f"the output {str(out)!r} is a folder; give a file name ending in .png")
    if out.exists() and not out.is_file():
        raise PlotError(f"the output {str(out)!r} is not a plain file (a device, pipe or socket); write elsewhere")
    if out.exists() and not force:
        raise PlotError(f"the output {str(out)!r} exists; pass --force to overwrite it")
    return out


def panel_data(lake: DataLake, run_ids: Sequence[str], panels: Sequence[Panel] = PANELS) -> PanelData:
    """The points of every panel: panel key -> (run_id, metric name) -> [(iteration, value)] sorted by iteration,
    from the published ``metrics`` rows of each run (runs in the given order, metric names sorted)."""
    data: PanelData = {panel.key: {} for panel in panels}
    for run_id in dict.fromkeys(run_ids):
        rows = lake.read_table("metrics", run_id, columns=["iteration", "name", "value"]).to_pylist()
        rows.sort(key=lambda row: (row["name"], row["iteration"]))
        for row in rows:
            for panel in panels:
                if panel.matches(row["name"]):
                    series = data[panel.key].setdefault((run_id, row["name"]), [])
                    series.append((int(row["iteration"]), float(row["value"])))
    return data


def _label(panel: Panel, run_id: str, name: str) -> str:
    match = VAL_METRIC.match(name)
    if not panel.key.startswith("val/*/") or match is None:
        return run_id
    return f"{run_id} · {match['env']}" + (f" {match['metric']}" if panel.key.endswith("*") else "")


def draw(data: PanelData, run_ids: Sequence[str], panels: Sequence[Panel] = PANELS):
    """A matplotlib Figure (Agg canvas) with one titled panel per indicator some run has data for (all of them, each
    saying "no data", when none has), the others named in the title; the lines carry ``gid`` =
    ``"<run_id>|<metric name>"`` so readers can match them to the data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = list(dict.fromkeys(run_ids))
    colours = {run: f"C{index % 10}" for index, run in enumerate(runs)}
    shown = [panel for panel in panels if data.get(panel.key)] or list(panels)
    empty = [panel.title for panel in panels if not data.get(panel.key)]
    columns = 2 if len(shown) > 1 else 1
    rows = math.ceil(len(shown) / columns)
    figure = Figure(figsize=(6.0 * columns, 3.2 * rows + 0.4), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, panel in zip(axes, shown, strict=False):
        ax.set_title(panel.title)
        ax.set_xlabel("iteration")
        ax.set_ylabel(panel.ylabel)
        series = data.get(panel.key, {})
        if not series:
            ax.text(0.5, 0.5, NO_DATA, transform=ax.transAxes, ha="center", va="center", color="grey", fontsize=14)
            continue
        _draw_series(ax, panel, series, colours)
    for ax in axes[len(shown) :]:
        ax.set_visible(False)
    left_out = f"\n{NO_DATA}, not drawn: {', '.join(empty)}" if empty and len(shown) < len(panels) else ""
    figure.suptitle("Collapse indicators: " + ", ".join(runs) + left_out)
    return figure


def _draw_series(ax: Any, panel: Panel, series: dict[SeriesKey, Points], colours: dict[str, str]) -> None:
    """One panel's curves: a colour per run, a line style per env (the teacher panel: agreement solid, chance
    dotted)."""
    envs = sorted({name for _, name in series})
    for (run_id, name), points in series.items():
        iterations, values = zip(*points, strict=True) if points else ((), ())
        style = ENV_STYLES[envs.index(name) % 4]
        if panel.key == "val/*/teacher_*":  # agreement solid, its chance level dotted, whatever the env
            style = "-" if name.endswith("_agreement") else ":"
        ax.plot(
            iterations,
            values,
            color=colours.get(run_id, "black"),
            linestyle=style,
            marker="o",
            markersize=3,
            label=_label(panel, run_id, name),
            gid=f"{run_id}|{name}",
        )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def plot_runs(root: str | Path | DataLake, run_ids: Sequence[str], out: str | Path, force: bool = True) -> PlotResult:
    """Plot the collapse indicators of ``run_ids`` (runs of the data root ``root``) into one PNG at ``out``
    (outside the data root; written atomically; an existing file only with ``force``). Returns the path, the
    plotted data and the figure."""
    lake = root if isinstance(root, DataLake) else DataLake(root)
    path = check_request(lake, run_ids, Path(out), force)
    data = panel_data(lake, run_ids)
    figure = draw(data, run_ids)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())
    return PlotResult(path, data, figure)
