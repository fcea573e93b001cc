"""A damaged lake never answers silently: every query that reads a table with a truncated or garbage Parquet file
fails (non-zero exit, the file named), however it filters, groups or joins; ``ragen runs`` and the end-of-run summary
too; one broken manifest shows as ``broken`` without hiding the other runs.

Why filtered queries used to print 0: a damaged table's view was a zero-or-one-row null table with a per-row
``error()`` in its WHERE clause; ``WHERE split = 'train'`` on that null row is false before ``error()`` runs (or the
scan is pruned), so the count was 0 with exit 0. The view now fails when the statement is bound."""

import json
import re
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_cli.summary import print_run_summary
from ragen_core.storage import DataLake, LakeError
from tests.storage.synthetic import make_run, write_run

RUNS = {"run-a": ("bandit", 0), "run-b": ("sokoban", 1)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Two runs written once through the real lake API; each test damages its own copy."""
    lake = DataLake(tmp_path_factory.mktemp("pristine") / "lake")
    runs = {
        run_id: make_run(seed, run_id, env, iterations=2, groups=2, group_size=2)
        for run_id, (env, seed) in RUNS.items()
    }
    for run in runs.values():
        write_run(lake, run)
    return lake.root, runs


@pytest.fixture()
def lake(pristine, tmp_path):
    source, runs = pristine
    shutil.copytree(source, tmp_path / "lake")
    lake = DataLake(tmp_path / "lake")
    lake.synthetic = runs
    return lake


def _damage(lake: DataLake, how: str, table: str = "trajectories", run_id: str = "run-a"):
    path = lake.partition_files(table, run_id, 1)[0]
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # the same size of random bytes: no Parquet magic, no footer
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    return path


def _sql(lake: DataLake, statement: str, *extra: str):
    return CliRunner().invoke(app, ["sql", statement, "--data-root", str(lake.root), *extra])


def _named(text: str, path) -> bool:
    return str(path) in re.sub(r"\s+", " ", text) or str(path) in text.replace("\n", "")


READS_TRAJECTORIES = [
    ("SELECT count(*) FROM trajectories WHERE split = 'train'", ()),
    ("SELECT count(*) FROM trajectories WHERE false", ()),
    ("SELECT split, count(*) FROM trajectories GROUP BY ALL", ()),
    ("SELECT env, avg(total_reward) FROM trajectories WHERE run_id = 'run-b' GROUP BY 1", ()),
    (
        "SELECT count(*) FROM turns u JOIN trajectories t USING (run_id, iteration, split, env, group_id, traj_index)",
        (),
    ),
    ("SELECT count(*) FROM metrics m LEFT JOIN trajectories t ON m.run_id = t.run_id AND false", ()),
    ("SELECT count(*) FROM turns WHERE traj_index IN (SELECT traj_index FROM trajectories WHERE iteration = 99)", ()),
    ("SELECT count(*) FROM trajectories", ("--run", "run-a")),
    ("SELECT count(*) FROM trajectories WHERE split = 'val'", ("--run", "run-a", "-f", "csv")),
    ("SELECT * FROM trajectories LIMIT 0", ("-f", "json")),
]


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_every_query_reading_the_damaged_table_fails_naming_the_file(lake, how):
    path = _damage(lake, how)
    for statement, extra in READS_TRAJECTORIES:
        result = _sql(lake, statement, *extra)
        assert result.exit_code == 2, (statement, result.output)
        assert result.stdout == "", statement  # nothing that looks like an answer
        assert "cannot read table 'trajectories'" in result.stderr and _named(result.stderr, path), statement


def test_the_other_tables_and_the_other_run_still_answer(lake):
    _damage(lake, "truncated")
    runs = lake.synthetic
    expected_metrics = sum(len(m) for run in runs.values() for m in run.metrics.values())
    result = _sql(lake, "SELECT count(*) AS n FROM metrics", "-f", "json")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": expected_metrics}]
    train_b = sum(t.split == "train" for t in runs["run-b"].trajectories)
    result = _sql(lake, "SELECT count(*) AS n FROM trajectories WHERE split = 'train'", "--run", "run-b", "-f", "json")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": train_b}] and train_b == 8


def test_runs_fails_on_a_damaged_table_it_reads(lake):
    path = _damage(lake, "truncated", table="evaluations")
    result = CliRunner().invoke(app, ["runs", "--data-root", str(lake.root)])
    assert result.exit_code == 2 and result.stdout == ""
    assert "cannot read table 'evaluations'" in result.stderr and _named(result.stderr, path)


def test_the_end_of_run_summary_fails_naming_the_file(lake):
    path = _damage(lake, "garbage")
    with pytest.raises(LakeError, match=re.escape(str(path))):
        print_run_summary(lake, "run-a", None)


def test_one_broken_manifest_is_listed_as_broken_without_hiding_the_others(lake):
    manifest = lake.run_dir("run-a") / "manifest.json"
    manifest.write_text(manifest.read_text()[:25])
    result = CliRunner().invoke(app, ["runs", "--data-root", str(lake.root), "--format", "json"])
    assert result.exit_code == 1, result.output  # listed, but never a silent success
    rows = {r["run_id"]: r for r in json.loads(result.stdout)}
    assert rows["run-a"]["status"] == "broken" and rows["run-b"]["status"] == "completed"
    assert rows["run-a"]["iterations"] == rows["run-b"]["iterations"] == 3  # commit markers still count
    assert "warning:" in result.stderr and _named(result.stderr, manifest)
    table = CliRunner().invoke(app, ["runs", "--data-root", str(lake.root)])
    assert table.exit_code == 1 and "broken" in table.stdout and "run-b" in table.stdout
    # a query of the runs table itself fails, naming the manifest; other tables still answer
    result = _sql(lake, "SELECT count(*) FROM runs WHERE status = 'completed'")
    assert result.exit_code == 2 and _named(result.stderr, manifest)
    assert _sql(lake, "SELECT count(*) FROM trajectories").exit_code == 0


def test_a_manifest_that_is_json_but_not_a_run_is_broken_too(lake):
    (lake.run_dir("run-a") / "manifest.json").write_text("[1, 2]")
    result = CliRunner().invoke(app, ["runs", "--data-root", str(lake.root), "--format", "json"])
    assert result.exit_code == 1
    assert {r["run_id"]: r["status"] for r in json.loads(result.stdout)} == {"run-a": "broken", "run-b": "completed"}
