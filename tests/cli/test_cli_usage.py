"""The command line's usage mistakes and first-day conveniences: one line on stderr for an unknown option or command
(not click's box), ``--version``, ``ragen sql --file`` and a query that begins with a SQL comment, and the note a
``ragen train`` without ``--config`` prints before it starts."""

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app, run_app
from ragen_core.storage import DataLake
from tests.cli.test_cli import two_finished_runs
from tests.storage.synthetic import make_run, write_run

COUNT_BY_RUN = "SELECT run_id, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1"


@pytest.fixture()
def root(tmp_path):
    return two_finished_runs(tmp_path).root


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["train", "--iterations", "3"], "train: No such option: --iterations (see '"),
        (["trian"], "No such command 'trian'. Did you mean 'train'"),
        (["sql"], "no query: give it as the argument"),
        (["eval", "x", "--n", "many"], "eval: Invalid value for '--n'"),
    ],
)
def test_a_usage_mistake_is_one_line_on_stderr(capsys, args, wanted):
    status = run_app(args)
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err  # one line: no usage box, no traceback
    assert err.startswith("error: ") and wanted in err, err
    assert "Traceback" not in err and "─" not in err


def test_the_help_and_the_version(capsys):
    assert run_app(["--help"]) == 0
    listed = capsys.readouterr().out
    order = [
        "train",
        "resume",
        "eval",
        "retrain",
        "sweep",
        "runs",
        "sql",
        "plot",
        "export",
        "reproduce",
        "config",
        "server",
        "upgrade-lake",
    ]
    positions = [listed.index(f"│ {name} ") for name in order]  # one line each, in the order of a user's day
    assert positions == sorted(positions), listed
    assert run_app(["--version"]) == 0
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"$', pyproject, re.M).group(1)  # the project's own, read directly
    assert capsys.readouterr().out.strip() == f"ragen {version}"


def test_a_query_that_begins_with_a_comment_says_how_to_pass_it(root, capsys):
    statement = f"-- name: count_by_run\n{COUNT_BY_RUN}"
    assert run_app(["sql", statement, "--data-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "put -- before it" in err and "--file" in err
    assert run_app(["train", "--a b"]) == 2  # another command's odd option gets the plain line
    assert "SQL" not in capsys.readouterr().err
    assert run_app(["sql", "--data-root", str(root), "-f", "json", "--", statement]) == 0  # as the line says
    assert [row["run_id"] for row in json.loads(capsys.readouterr().out)] == ["run-a", "run-b"]


def test_sql_reads_its_query_from_a_file_or_stdin(root, tmp_path):
    expected = CliRunner().invoke(app, ["sql", COUNT_BY_RUN, "--data-root", str(root), "-f", "json"])
    assert expected.exit_code == 0 and len(json.loads(expected.output)) == 2
    query_file = tmp_path / "q.sql"
    query_file.write_text(f"-- name: count_by_run\n{COUNT_BY_RUN}\n")  # as docs/sql.md's worked queries are written
    from_file = CliRunner().invoke(app, ["sql", "--file", str(query_file), "--data-root", str(root), "-f", "json"])
    assert (from_file.exit_code, from_file.output) == (0, expected.output)
    piped = CliRunner().invoke(
        app, ["sql", "--file", "-", "--data-root", str(root), "-f", "json"], input=query_file.read_text()
    )
    assert (piped.exit_code, piped.output) == (0, expected.output)
    both = CliRunner().invoke(app, ["sql", COUNT_BY_RUN, "--file", str(query_file), "--data-root", str(root)])
    assert both.exit_code == 2 and "not both" in both.output
    missing = CliRunner().invoke(app, ["sql", "--file", str(tmp_path / "none.sql"), "--data-root", str(root)])
    assert missing.exit_code == 2 and "cannot read --file" in missing.output


def test_train_without_a_config_says_what_it_trains_before_it_starts(root):
    """The note comes once the config and the data root are checked, before anything runs: here the run id is
    taken by a stored run of another config, so the command is then refused, having trained nothing."""

    def stored() -> list[Path]:  # every file but the run's writer lock, which the refused admission took
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.name != "writer.lock")

    before = stored()
    result = CliRunner().invoke(app, ["train", "--data-root", str(root), "--run-id", "run-a", "trainer.iterations=1"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("note: no --config: training the built-in defaults")
    assert "configs/bandit.yaml" in lines[0]
    assert lines[-1].startswith("error: ") and "run-a" in lines[-1]
    assert stored() == before
    with_config = CliRunner().invoke(
        app, ["train", "--config", "configs/bandit.yaml", "--data-root", str(root), "--run-id", "run-a"]
    )
    assert with_config.exit_code == 2 and "note:" not in with_config.output


def test_the_entry_point_exits_with_the_status(tmp_path):
    """`python -m ragen_cli.main` (what the `ragen` script runs): the status of a usage mistake reaches the shell."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "ragen_cli.main", "runs", "--nope"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "No such option: --nope" in done.stderr


def test_the_end_of_run_summary_has_a_row_per_validated_iteration(tmp_path):
    """The summary's rows: the iterations that validated (every iteration of a run that never did), by hand."""
    from ragen_cli.summary import SUMMARY_SQL
    from ragen_core.storage import query

    lake = DataLake(tmp_path / "lake")
    sparse = make_run(4, "sparse", "bandit", 3, groups=1, group_size=2)  # train at 0, 1, 2; validation at 0..3
    sparse.trajectories = [t for t in sparse.trajectories if t.split == "train" or t.iteration in (0, 3)]
    never = make_run(5, "never", "bandit", 3, groups=1, group_size=2)
    never.trajectories = [t for t in never.trajectories if t.split == "train"]
    for run in (sparse, never):
        write_run(lake, run)

    def keys(run_id: str) -> list[tuple[int, str]]:
        return [(r["iteration"], r["split"]) for r in query(lake, SUMMARY_SQL, params={"run_id": run_id}).to_pylist()]

    assert keys("sparse") == [(0, "train"), (0, "val"), (3, "val")]  # iterations 1 and 2 did not validate
    assert keys("never") == [(0, "train"), (1, "train"), (2, "train")]


def test_a_narrow_table_keeps_each_run_id_on_one_line():
    """Ids are copied from tables: on a narrow terminal they keep one line while the other columns fold."""
    import io

    import pyarrow as pa
    from rich.console import Console

    from ragen_cli.common import print_table

    run_id = "frozen_lake-23757165-20261127T175621"
    note = "a long note that has to fold onto several lines on a terminal this narrow"
    out = io.StringIO()
    print_table(pa.table({"run_id": [run_id], "note": [note]}), Console(file=out, width=60))
    text = out.getvalue()
    assert any(run_id in line for line in text.splitlines()), text  # whole, on one line
    assert note not in text  # folded


def test_run_app_passes_exits_and_errors_through_and_says_aborted_once(capsys):
    """A command's SystemExit keeps its status, another exception goes on up (as a traceback would), and an
    aborted prompt is one line with status 1."""
    import typer

    demo = typer.Typer()

    @demo.command()
    def leave(code: int) -> None:
        raise SystemExit(code)

    @demo.command()
    def crash() -> None:
        raise RuntimeError("a defect")

    @demo.command()
    def ask() -> None:
        typer.confirm("go on?", abort=True)

    with pytest.raises(SystemExit) as exited:
        run_app(["leave", "3"], demo)
    assert exited.value.code == 3
    with pytest.raises(RuntimeError, match="a defect"):
        run_app(["crash"], demo)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", __import__("io").StringIO(""))  # Ctrl-D at the prompt
        assert run_app(["ask"], demo) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == "Aborted."


def test_two_ids_too_wide_for_the_terminal_fold_whole():
    """Where the ids cannot all keep one line, every column folds: no id is cut short."""
    import io

    import pyarrow as pa
    from rich.console import Console

    from ragen_cli.common import print_table

    ids = {"run_id": "frozen_lake-23757165-20261127T175621", "sweep_id": "sweep-52c218dc-p000-20261127T175621"}
    out = io.StringIO()
    print_table(pa.table({name: [value] for name, value in ids.items()}), Console(file=out, width=50))
    columns: dict[int, str] = {}
    for line in out.getvalue().splitlines():
        cells = line.split("│")[1:-1]
        for index, cell in enumerate(cells):
            columns[index] = columns.get(index, "") + cell.strip()
    assert "…" not in out.getvalue()
    assert sorted(columns.values()) == sorted(ids.values())  # the cells' lines (the header row is drawn apart)
