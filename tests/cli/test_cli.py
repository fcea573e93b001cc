"""``ragen sql`` (scope, formats, --out, read-only) and ``ragen runs`` (list, rm, compact) over a hand-built lake."""

import json

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake, query
from tests.storage.synthetic import make_run, write_run

COUNT_BY_RUN = "SELECT run_id, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1"


def two_finished_runs(tmp_path) -> DataLake:
    """A hand-built lake under ``tmp_path/lake``: run-a (Bandit) and run-b (Sokoban), both completed."""
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(1, "run-a", "bandit", 1, groups=2, group_size=2), created="2025-01-01T00:00:00+00:00")
    write_run(lake, make_run(2, "run-b", "sokoban", 1, groups=2, group_size=2), created="2025-01-02T00:00:00+00:00")
    return lake


@pytest.fixture()
def root(tmp_path):
    lake = two_finished_runs(tmp_path)
    write_run(
        lake,
        make_run(3, "live", "bandit", 1, groups=2, group_size=2),
        status="running",
        created="2025-01-03T00:00:00+00:00",
    )
    return lake.root


def _invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def test_sql_scopes_to_one_run(root):
    everything = json.loads(_invoke("sql", COUNT_BY_RUN, "--data-root", root, "--format", "json").output)
    assert [r["run_id"] for r in everything] == ["live", "run-a", "run-b"]
    result = _invoke("sql", COUNT_BY_RUN, "--data-root", root, "--run", "run-b", "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [r for r in everything if r["run_id"] == "run-b"]
    result = _invoke("sql", COUNT_BY_RUN, "--data-root", root, "--run", "nope")
    assert result.exit_code == 2 and "unknown run 'nope'" in result.output


@pytest.mark.parametrize("output_format", ["csv", "json", "parquet", "table"])
def test_sql_writes_every_format_to_a_file(root, tmp_path, output_format):
    out = tmp_path / f"result.{output_format}"
    result = _invoke("sql", COUNT_BY_RUN, "--data-root", root, "--format", output_format, "--out", out)
    assert result.exit_code == 0, result.output
    expected = query(root, COUNT_BY_RUN)
    if output_format == "parquet":
        assert pq.read_table(out).equals(expected)
    elif output_format == "csv":
        assert pacsv.read_csv(out).to_pylist() == expected.to_pylist()
    elif output_format == "json":
        assert json.loads(out.read_text()) == expected.to_pylist()
    else:
        text = out.read_text()
        assert "run_id" in text and all(r["run_id"] in text for r in expected.to_pylist())


def test_sql_output_mistakes_fail_clearly(root):
    result = _invoke("sql", COUNT_BY_RUN, "--data-root", root, "--format", "parquet")
    assert result.exit_code == 2 and "--format parquet writes a file: give it with --out FILE" in result.output
    result = _invoke("sql", COUNT_BY_RUN, "--data-root", root, "-f", "csv", "--out", root / "trajectories" / "x.csv")
    assert result.exit_code == 2 and "inside the data root" in result.output
    result = _invoke("sql", COUNT_BY_RUN, "--data-root", root, "--format", "xml")
    assert result.exit_code == 2 and "--format must be one of table, csv, json, parquet" in result.output


def test_sql_refuses_writes_to_the_lake(root):
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for statement in (
        f"COPY trajectories TO '{root}/trajectories/run_id=x/iteration=0/part-x.parquet'",
        "CREATE TABLE t AS SELECT 1",
        f"ATTACH '{root}/evil.db'",
    ):
        result = _invoke("sql", statement, "--data-root", root)
        assert result.exit_code == 2, statement
        assert "query refused" in result.output and "read-only" in result.output
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_runs_lists_every_run(root):
    result = _invoke("runs", "--data-root", root, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["run_id"], r["status"], r["iterations"]) for r in rows] == [
        ("run-a", "completed", 2),
        ("run-b", "completed", 2),
        ("live", "interrupted", 2),  # its manifest says running, and no process holds its writer lock: it died
    ]
    assert rows[0]["val_success"].startswith("bandit ") and rows[0]["created_at"] == "2025-01-01 00:00:00"
    table = _invoke("runs", "--data-root", root)
    assert table.exit_code == 0 and "run-b" in table.output
    # what the numbers mean, under the table only (csv and json stay data): a completed run of 1 iteration showed 2
    assert "a completed run of N iterations shows N + 1" in " ".join(table.stdout.split())
    csv = _invoke("runs", "--data-root", root, "-f", "csv")
    assert "shows N + 1" not in result.output and "shows N + 1" not in csv.output


def test_runs_rm_asks_refuses_and_removes(root):
    result = _invoke("runs", "rm", "nope", "--data-root", root)
    assert result.exit_code == 2 and "unknown run 'nope'" in result.output
    result = _invoke("runs", "rm", "run-a", "--data-root", root, input="n\n")
    assert result.exit_code == 1 and "nothing removed" in result.output and "trajectories: 16 row(s)" in result.output
    assert (root / "runs" / "run-a").is_dir()
    result = _invoke("runs", "rm", "run-a", "--data-root", root, input="y\n")
    assert result.exit_code == 0 and "removed run run-a" in result.output
    # 'running' with no live writer is a run that died: removed as any other (one whose writer lives is refused,
    # --force or not: tests/storage/test_housekeeping.py)
    result = _invoke("runs", "rm", "live", "--data-root", root, "--yes")
    assert result.exit_code == 0, result.output
    assert query(root, "SELECT DISTINCT run_id FROM turns").to_pylist() == [{"run_id": "run-b"}]
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["run-b"]


def test_runs_compact_reports_what_it_merged(root):
    before = query(root, "SELECT * FROM turns ORDER BY ALL")
    result = _invoke("runs", "compact", "run-b", "--data-root", root)
    assert result.exit_code == 0, result.output
    assert "merged 2 partition(s), 4 files -> 2" in result.output  # trajectories and turns of iteration 0
    assert query(root, "SELECT * FROM turns ORDER BY ALL").equals(before)
    result = _invoke("runs", "compact", "nope", "--data-root", root)
    assert result.exit_code == 2 and "unknown run 'nope'" in result.output


def test_a_precision_this_machine_cannot_run_is_refused_before_anything_starts(tmp_path):
    """bf16 is a valid config anywhere (planned on a CPU head node); running it needs CUDA, checked at the start."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: bf16 may run here")
    root = tmp_path / "lake"
    result = _invoke("train", "--run-id", "p", "--data-root", root, "trainer.precision=bf16", "trainer.iterations=1")
    assert result.exit_code == 2, result.output
    assert "trainer.precision=bf16 needs a CUDA GPU" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (root / "runs" / "p" / "manifest.json").exists()
    assert not (root / "_prefect").exists()  # no Prefect server was started


def test_an_extension_stopped_by_a_full_disk_names_what_became_of_the_run_and_the_command_again(tmp_path, monkeypatch):
    """A want of space the command itself detects after an extension (its own line, not the run's): undone, the run
    is completed as it was and the line names the extension's own command (the plain advice, `ragen resume <id>`,
    found the run completed and did nothing); a longer run that failed after its first new commit is continued by
    the same command."""
    from ragen_cli.main import _failed_extension
    from ragen_core.storage.maintenance.space import SPACE_PREFIX, space_message

    lake = two_finished_runs(tmp_path)
    command = ["ragen", "resume", "run-a", "--data-root", "my lake", "--force-config", "trainer.iterations"]
    monkeypatch.setattr("sys.argv", [*command, "trainer.iterations=5"])
    said = _failed_extension(lake, "run-a", space_message("run-a", "the run's files"))
    assert said == (
        f"{SPACE_PREFIX} while writing the run's files: the extension was undone, run run-a is completed as it was; "
        "free space or raise the limit (ulimit -f), then extend it again: `ragen resume run-a --data-root 'my lake' "
        "--force-config trainer.iterations trainer.iterations=5`"
    )
    write_run(lake, make_run(4, "longer", "bandit", 1), status="failed")
    said = _failed_extension(lake, "longer", space_message("longer", "the run's files"))
    assert said.endswith(
        "then run the same command again: `ragen resume run-a --data-root 'my lake' --force-config "
        "trainer.iterations trainer.iterations=5`"
    )
