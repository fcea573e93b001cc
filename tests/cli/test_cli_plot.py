"""``ragen plot`` over a lake of hand-written metrics rows: one PNG of several runs; mistakes exit 2 with a hint."""

from __future__ import annotations

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake
from tests.monitor.test_plots import RUN_A_METRICS, RUN_B_METRICS, write_metrics_run


@pytest.fixture()
def root(tmp_path):
    lake = DataLake(tmp_path / "lake")
    write_metrics_run(lake, "run-a", RUN_A_METRICS, ("bandit",), seed=1)
    write_metrics_run(lake, "run-b", RUN_B_METRICS, ("bandit",), seed=2)
    return lake.root


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _text(result) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_plot_writes_one_png_of_several_runs(root, tmp_path):
    out = tmp_path / "out" / "runs.png"
    result = _invoke("plot", "run-a", "run-b", "--out", out, "--data-root", root)
    assert result.exit_code == 0, result.output
    text = _text(result)
    assert text.startswith("wrote ") and "runs.png (8 panels; no data, not drawn: rollout/response_length)" in text
    assert imread(out).ndim == 3
    assert not list(out.parent.glob(".*"))  # no temporary file left behind


def test_plot_mistakes_exit_2_with_a_hint(root, tmp_path):
    result = _invoke("plot", "run-a", "nope", "--out", tmp_path / "x.png", "--data-root", root)
    assert result.exit_code == 2 and "unknown run id(s) 'nope'" in _text(result) and "ragen runs" in _text(result)
    result = _invoke("plot", "run-a", "--out", root / "x.png", "--data-root", root)
    assert result.exit_code == 2 and "inside the data root" in _text(result)
    assert not (root / "x.png").exists()
    result = _invoke("plot", "run-a", "--out", tmp_path / "x.png", "--data-root", tmp_path / "missing")
    assert result.exit_code == 2 and "does not exist" in _text(result)
    result = _invoke("plot", "run-a", "--data-root", root)
    assert result.exit_code == 2 and "--out" in result.output
    assert not (tmp_path / "x.png").exists()
