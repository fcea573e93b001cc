"""Collapse-indicator plots: the returned data and the curves read back from the figure equal an independent DuckDB
query of the metrics table; panels without data say so; bad requests fail before anything is written."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from matplotlib.image import imread

from ragen_core.monitor.plots import NO_DATA, PANELS, PlotError, plot_runs
from ragen_core.storage import DataLake

ITERATIONS = 4
RUN_A_METRICS = (
    "rollout/reward_mean",
    "rollout/reward_std",
    "rollout/in_group_reward_std",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_loss",
    "val/bandit/pass@k",
    "diag/reasoning_mi_per_token",
    "val/bandit/teacher_agreement",
    "val/bandit/teacher_chance",
)
RUN_B_METRICS = ("rollout/reward_mean", "rollout/reward_std", "rollout/in_group_reward_std", "actor/entropy")
PANEL_SQL = {  # which metric names each panel shows, said in SQL (independent of ragen_core.monitor.plots' matching)
    "val/*/success": "regexp_matches(name, '^val/[^/]+/success$')",
    "val/*/teacher_*": "regexp_matches(name, '^val/[^/]+/teacher_(agreement|chance)$')",
    **{p.key: f"name = '{p.key}'" for p in PANELS if not p.key.startswith("val/*/")},
}


def write_metrics_run(lake: DataLake, run_id: str, names: tuple[str, ...], val_envs: tuple[str, ...], seed: int):
    """A run's metrics rows, written and committed through the lake API: every name at every iteration, validation
    success of each env at iterations 0 and the last (as eval.every would)."""
    rng = np.random.default_rng(seed)
    for iteration in range(ITERATIONS):
        values = {name: float(rng.uniform(-2, 2)) for name in names}
        if iteration in (0, ITERATIONS - 1):
            values |= {f"val/{env}/success": float(rng.uniform(0, 1)) for env in val_envs}
        rows = [{"run_id": run_id, "iteration": iteration, "name": k, "value": v} for k, v in sorted(values.items())]
        lake.write_rows("metrics", run_id, iteration, rows, stage="commit")
        lake.commit_iteration(run_id, iteration, {"metrics": len(rows)})


@pytest.fixture()
def lake(tmp_path) -> DataLake:
    lake = DataLake(tmp_path / "lake")
    write_metrics_run(lake, "run-a", RUN_A_METRICS, ("bandit", "bandit_test"), seed=1)
    write_metrics_run(lake, "run-b", RUN_B_METRICS, ("bandit",), seed=2)
    write_metrics_run(lake, "run-c", RUN_B_METRICS, ("sokoban",), seed=3)  # in the lake, not asked for
    return lake


def duckdb_panels(root, run_ids: list[str]) -> dict[str, dict[tuple[str, str], list[tuple[int, float]]]]:
    """panel key -> (run, name) -> [(iteration, value)], with plain DuckDB over the Parquet files."""
    source = f"read_parquet('{root}/metrics/*/*/*.parquet', hive_partitioning = true)"
    runs = ", ".join(f"'{r}'" for r in run_ids)
    out = {}
    for panel, condition in PANEL_SQL.items():
        rows = duckdb.sql(
            f"SELECT run_id, name, iteration::INT, value FROM {source} WHERE run_id IN ({runs}) AND {condition} "
            "ORDER BY run_id, name, iteration"
        ).fetchall()
        series: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for run_id, name, iteration, value in rows:
            series.setdefault((run_id, name), []).append((iteration, value))
        out[panel] = series
    return out


def figure_lines(figure) -> dict[str, dict[tuple[str, str], list[tuple[int, float]]]]:
    """The curves as drawn: panel title -> (run, name) from the line's gid -> zip(xdata, ydata)."""
    out = {}
    for ax in figure.axes:
        if not ax.get_visible():
            continue
        out[ax.get_title()] = {
            tuple(line.get_gid().split("|", 1)): [
                (int(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)
            ]
            for line in ax.get_lines()
        }
    return out


def test_plotted_curves_equal_the_metrics_table(lake, tmp_path):
    out = tmp_path / "plots" / "runs.png"
    result = plot_runs(lake.root, ["run-a", "run-b"], out)
    expected = duckdb_panels(lake.root, ["run-a", "run-b"])
    assert result.path == out.resolve()
    assert result.data == expected
    assert set(expected["val/*/success"]) == {
        ("run-a", "val/bandit/success"),
        ("run-a", "val/bandit_test/success"),
        ("run-b", "val/bandit/success"),
    }
    assert [it for it, _ in expected["val/*/success"][("run-b", "val/bandit/success")]] == [0, ITERATIONS - 1]
    drawn = figure_lines(result.figure)
    assert drawn == {p.title: expected[p.key] for p in PANELS if expected[p.key]}  # panels without data: not drawn
    image = imread(out)  # a real PNG, as big as the figure
    assert image.shape[:2] == (round(result.figure.get_figheight() * 100), round(result.figure.get_figwidth() * 100))


def test_panels_are_labelled_and_one_colour_per_run(lake, tmp_path):
    result = plot_runs(lake, ["run-b", "run-a"], tmp_path / "runs.png")
    axes = {ax.get_title(): ax for ax in result.figure.axes if ax.get_visible()}
    assert list(axes) == [p.title for p in PANELS if result.data[p.key]]
    assert {ax.get_xlabel() for ax in axes.values()} == {"iteration"}
    colours = {}
    for ax in axes.values():
        for line in ax.get_lines():
            colours.setdefault(line.get_gid().split("|")[0], set()).add(line.get_color())
    assert colours == {"run-b": {"C0"}, "run-a": {"C1"}}  # in the order asked
    legend = [t.get_text() for t in axes["Validation success"].get_legend().get_texts()]
    assert sorted(legend) == ["run-a · bandit", "run-a · bandit_test", "run-b · bandit"]
    val_styles = {line.get_gid(): line.get_linestyle() for line in axes["Validation success"].get_lines()}
    assert val_styles["run-a|val/bandit/success"] != val_styles["run-a|val/bandit_test/success"]


def test_panels_without_data_are_left_out_and_named(lake, tmp_path):
    result = plot_runs(lake, ["run-b"], tmp_path / "b.png")  # run-b has no grad norm; no run has response length
    assert result.data["actor/grad_norm"] == {} and result.data["rollout/response_length"] == {}
    axes = {ax.get_title(): ax for ax in result.figure.axes if ax.get_visible()}
    assert list(axes) == [p.title for p in PANELS if result.data[p.key]]
    assert "Gradient norm" not in axes and "Response length" not in axes
    assert all(ax.get_lines() and not ax.texts for ax in axes.values())
    empty = [p.title for p in PANELS if not result.data[p.key]]
    assert "Gradient norm" in empty and "Response length" in empty  # the premise
    assert result.figure.get_suptitle().endswith(f"{NO_DATA}, not drawn: {', '.join(empty)}")


def test_with_no_data_at_all_every_panel_says_so(lake, tmp_path):
    from ragen_core.monitor.plots import draw

    figure = draw({p.key: {} for p in PANELS}, ["run-x"])
    axes = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == [p.title for p in PANELS]
    assert all([t.get_text() for t in ax.texts] == [NO_DATA] and not ax.get_lines() for ax in axes)


def test_bad_requests_fail_clearly_and_write_nothing(lake, tmp_path):
    before = sorted(p.relative_to(lake.root) for p in lake.root.rglob("*"))
    with pytest.raises(PlotError, match=r"unknown run id\(s\) 'nope'.*ragen runs --data-root"):
        plot_runs(lake, ["run-a", "nope"], tmp_path / "x.png")
    with pytest.raises(PlotError, match="inside the data root.*read-only"):
        plot_runs(lake, ["run-a"], lake.root / "runs" / "run-a" / "plot.png")
    with pytest.raises(PlotError, match="must be a .png file"):
        plot_runs(lake, ["run-a"], tmp_path / "x.pdf")
    with pytest.raises(PlotError, match="at least one run id"):
        plot_runs(lake, [], tmp_path / "x.png")
    assert sorted(p.relative_to(lake.root) for p in lake.root.rglob("*")) == before
    assert not list(tmp_path.glob("x.*"))


def test_teacher_agreement_panel_draws_agreement_and_chance_apart(lake, tmp_path):
    result = plot_runs(lake, ["run-a"], tmp_path / "a.png")
    axes = {ax.get_title(): ax for ax in result.figure.axes if ax.get_visible()}
    panel = axes["Teacher agreement (validation) against chance"]
    lines = {line.get_gid(): line for line in panel.get_lines()}
    assert set(lines) == {"run-a|val/bandit/teacher_agreement", "run-a|val/bandit/teacher_chance"}
    assert lines["run-a|val/bandit/teacher_agreement"].get_linestyle() == "-"
    assert lines["run-a|val/bandit/teacher_chance"].get_linestyle() == ":"
    legend = sorted(t.get_text() for t in panel.get_legend().get_texts())
    assert legend == ["run-a · bandit teacher_agreement", "run-a · bandit teacher_chance"]
