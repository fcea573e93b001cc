"""Users see their data literally and clear errors: cells are never rich markup, errors go to stderr with a non-zero
exit (never into the result on stdout), and a user's mistake shows no traceback."""

import json
import os
import re

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake
from tests.storage.synthetic import make_run, write_run

MARKUP = ["[/x]", "[red]vanishes?[/red]", "[bold]", "[link=file:///etc]x[/link]", "\\[escaped]"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    lake = DataLake(tmp_path_factory.mktemp("lake"))
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    turn = {
        "run_id": "run-a",
        "iteration": 0,
        "split": "train",
        "env": "bandit",
        "group_id": 9,
        "observation": "o",
        "think": "t",
        "answer": "a",
        "actions": [],
        "valid": False,
        "format_ok": False,
        "reward": 0.0,
        "penalty": -0.1,
        "done": True,
        "truncated": False,
        "response_tokens": 3,
        "info": "{}",
    }
    rows = [{**turn, "traj_index": i, "turn_index": 0, "response": text} for i, text in enumerate(MARKUP)]
    lake.write_rows(
        "turns", "run-a", 0, pa.Table.from_pylist(rows, schema=lake.spec("turns").arrow_schema), stage="markup"
    )
    return lake.root


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _no_traceback(result) -> None:
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # typer.Exit, not a crash
    assert "Traceback" not in result.output


def test_model_output_with_markup_is_shown_literally_in_tables(root):
    query = "SELECT traj_index, response FROM turns WHERE group_id = 9 ORDER BY 1"
    result = _invoke("sql", query, "--data-root", root)
    assert result.exit_code == 0, result.output
    for text in MARKUP:
        assert text in result.stdout, text
    header = _invoke("sql", 'SELECT 1 AS "[red]h[/red]", \'[/]\' AS "[/x]"', "--data-root", root)
    assert header.exit_code == 0 and "[red]h[/red]" in header.stdout and "[/x]" in header.stdout
    assert "[/]" in header.stdout


def test_markup_survives_a_table_written_to_a_file(root, tmp_path):
    out = tmp_path / "t.txt"
    result = _invoke("sql", "SELECT response FROM turns WHERE group_id = 9", "--data-root", root, "--out", out)
    assert result.exit_code == 0 and all(text in out.read_text() for text in MARKUP)


def test_errors_go_to_stderr_and_never_into_the_result(root, tmp_path):
    result = _invoke("sql", "SELECT nonexistent FROM trajectories", "--data-root", root, "--format", "csv")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: query failed") and "nonexistent" in result.stderr
    _no_traceback(result)
    refused = _invoke("sql", "DROP VIEW turns", "--data-root", root, "-f", "json")
    assert refused.exit_code == 2 and refused.stdout == "" and "query refused" in refused.stderr


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("SELEC 1", 'query failed: Parser Error: syntax error at or near "SELEC" (at line 1, column 1)'),
        ("SELECT 1\nFROM runs WHERE ((", 'query failed: Parser Error: syntax error at or near "(" (at line 2, column'),
        ("SELECT nope FROM runs", 'query failed: Binder Error: Referenced column "nope" not found in FROM clause!'),
    ],
)
def test_a_failed_query_is_one_line_with_where_it_failed(root, statement, expected):
    """Issue 39 item 6: DuckDB's caret block (the message, a blank line, the quoted line, a caret line) is said in one
    line, the caret as its line and column."""
    result = _invoke("sql", statement, "--data-root", root)
    assert result.exit_code == 2 and result.stdout == "", result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), result.stderr
    _no_traceback(result)


def test_an_error_of_several_lines_is_said_in_one():
    from ragen_cli.common import one_line

    assert one_line("invalid config:\n  a.b: bad\n  c: worse\n") == "invalid config: a.b: bad; c: worse"
    assert one_line("first\n\n  second\r\nthird\x1b[2J") == "first; second; third\\x1b[2J"
    caret = "Parser Error: x\n\nLINE 3: SELECT ((\n                ^"
    assert one_line(caret) == "Parser Error: x (at line 3, column 9)"


def test_error_messages_are_literal(root):
    result = _invoke("sql", 'SELECT * FROM "[red]gone[/red]"', "--data-root", root)
    assert result.exit_code == 2 and "[red]gone[/red]" in result.stderr
    _no_traceback(result)


def test_a_data_root_that_is_a_file_is_a_clear_error(root, tmp_path):
    file_root = tmp_path / "not-a-folder"
    file_root.write_text("x")
    for args in (["sql", "SELECT 1"], ["runs"], ["train", "trainer.iterations=1"], ["resume", "run-a"]):
        result = _invoke(*args, "--data-root", file_root)
        assert result.exit_code == 2, (args, result.output)
        assert "is a file, not a folder" in result.stderr, args
        _no_traceback(result)
    below = _invoke("train", "--data-root", file_root / "sub", "trainer.iterations=1")
    assert below.exit_code == 2 and "cannot be written" in below.stderr
    _no_traceback(below)
    assert file_root.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_data_root_is_a_clear_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = _invoke("train", "--data-root", folder, "trainer.iterations=1")
        assert result.exit_code == 2 and "cannot be written" in result.stderr
        _no_traceback(result)
    finally:
        folder.chmod(0o755)


def test_out_must_be_a_new_file_unless_forced(root, tmp_path):
    statement = "SELECT 1 AS x"
    result = _invoke("sql", statement, "--data-root", root, "--out", tmp_path, "-f", "csv")
    assert result.exit_code == 2 and "is a folder" in result.stderr
    _no_traceback(result)
    existing = tmp_path / "keep.json"
    existing.write_text("precious")
    result = _invoke("sql", statement, "--data-root", root, "--out", existing, "-f", "json")
    assert result.exit_code == 2 and "exists; pass --force" in result.stderr and existing.read_text() == "precious"
    _no_traceback(result)
    result = _invoke("sql", statement, "--data-root", root, "--out", existing, "-f", "json", "--force")
    assert result.exit_code == 0 and json.loads(existing.read_text()) == [{"x": 1}]
    result = _invoke("sql", statement, "--data-root", root, "--out", "/proc/no/such/x.csv", "-f", "csv")
    assert result.exit_code == 2 and "cannot write --out" in result.stderr
    _no_traceback(result)


def test_a_plot_that_cannot_be_written_is_a_clear_error(root):
    result = _invoke("plot", "run-a", "--out", "/proc/no/such/plot.png", "--data-root", root)
    assert result.exit_code == 2 and "cannot write --out '/proc/no/such/plot.png'" in result.stderr
    _no_traceback(result)


def test_csv_holds_list_and_struct_cells_as_json(root):
    """CSV has no nested cells: a list or struct column comes out as one JSON text per cell, never a traceback."""
    import csv
    import io

    statement = "SELECT 1 AS n, ['Up', 'Left'] AS actions, {'a': 1, 'b': 'x'} AS s, CAST(NULL AS VARCHAR[]) AS none"
    result = _invoke("sql", statement, "--data-root", root, "-f", "csv")
    assert result.exit_code == 0, result.output
    (row,) = list(csv.DictReader(io.StringIO(result.stdout)))
    assert row["n"] == "1" and json.loads(row["actions"]) == ["Up", "Left"]
    assert json.loads(row["s"]) == {"a": 1, "b": "x"} and row["none"] == ""
    stored = _invoke("sql", "SELECT actions FROM turns WHERE group_id = 9 LIMIT 1", "--data-root", root, "-f", "csv")
    assert stored.exit_code == 0 and stored.stdout.splitlines() == ['"actions"', '"[]"']


def test_out_never_replaces_a_link_a_pipe_or_a_device(root, tmp_path):
    target = tmp_path / "kept.csv"
    target.write_text("precious\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for out, message in (
        (link, "is a symbolic link"),
        (fifo, "is not a plain file"),
        (os.devnull, "is not a plain file"),
    ):
        result = _invoke("sql", "SELECT 1", "--data-root", root, "--format", "csv", "--out", out, "--force")
        assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.output
        _no_traceback(result)
    assert link.is_symlink() and target.read_text() == "precious\n"
    assert fifo.is_fifo() and os.path.exists(os.devnull) and not os.path.isfile(os.devnull)


def test_plot_asks_for_force_like_sql_and_never_replaces_a_link_or_pipe(root, tmp_path):
    out = tmp_path / "runs.png"
    out.write_bytes(b"not yet a plot")
    result = _invoke("plot", "run-a", "--out", out, "--data-root", root)
    assert result.exit_code == 2 and "exists; pass --force" in " ".join(result.stderr.split())
    assert out.read_bytes() == b"not yet a plot"
    result = _invoke("plot", "run-a", "--out", out, "--data-root", root, "--force")
    assert result.exit_code == 0 and out.read_bytes().startswith(b"\x89PNG")
    link = tmp_path / "link.png"
    link.symlink_to(out)
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    for target, message in ((link, "is a symbolic link"), (fifo, "is not a plain file")):
        result = _invoke("plot", "run-a", "--out", target, "--data-root", root, "--force")
        assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.output
    assert link.is_symlink() and fifo.is_fifo()


CONTROL = ["\x1b[2J\x1b[H", "bell\x07", "\x1b]0;title\x07", "carriage\rreturn", "csi\x9b31m", "del\x7f"]


def test_terminal_control_characters_are_escaped_in_table_output(tmp_path):
    """Stored text (a model's reply) and generated text (chr(27) || '[2J') never reach the terminal as control
    sequences: each control character shows as a \\xNN escape; csv and json keep the exact text."""
    lake = DataLake(tmp_path / "lake")
    write_run(lake, make_run(0, "run-a", "bandit", iterations=1, groups=2, group_size=2))
    turn = {
        "run_id": "run-a",
        "iteration": 0,
        "split": "train",
        "env": "bandit",
        "group_id": 9,
        "observation": "o",
        "think": "t",
        "answer": "a",
        "actions": [],
        "valid": False,
        "format_ok": False,
        "reward": 0.0,
        "penalty": -0.1,
        "done": True,
        "truncated": False,
        "response_tokens": 3,
        "info": "{}",
    }
    rows = [{**turn, "traj_index": i, "turn_index": 0, "response": text} for i, text in enumerate(CONTROL)]
    lake.write_rows("turns", "run-a", 0, rows, stage="control")
    statement = "SELECT response FROM turns WHERE group_id = 9 ORDER BY traj_index"
    table = _invoke("sql", statement, "--data-root", lake.root)
    assert table.exit_code == 0, table.output
    assert not any(c in table.stdout for c in "\x1b\x07\r\x9b\x7f")
    for text in CONTROL:  # the same text, each control character written out
        shown = "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in text)
        assert shown in table.stdout, shown
    generated = _invoke("sql", "SELECT chr(27) || '[2J' AS \"x\x1b[31m\"", "--data-root", lake.root)
    assert generated.exit_code == 0 and "\x1b" not in generated.stdout and "\\x1b[2J" in generated.stdout
    assert "x\\x1b[31m" in generated.stdout  # a column name too
    exact = _invoke("sql", statement, "--data-root", lake.root, "-f", "json")
    assert [r["response"] for r in json.loads(exact.stdout)] == CONTROL
    error = _invoke("sql", 'SELECT * FROM "no\x1b[2Jtable"', "--data-root", lake.root)
    assert error.exit_code == 2 and "\x1b" not in error.stderr and "\\x1b" in error.stderr


# where a DeepSpeed op build can land: the environment's folder (make install), DeepSpeed's and torch's defaults
_OP_FOLDERS = ("var/torch_extensions", "/tmp/torch_extensions", "~/.cache/torch_extensions")


def _op_files_written_since(start_ns: int) -> list[str]:
    """Files of any compiled-op folder written at or after ``start_ns`` (a build writes its .o/.so/ninja files)."""
    import sys
    from pathlib import Path

    folders = [Path(sys.prefix) / f if not f.startswith(("/", "~")) else Path(f).expanduser() for f in _OP_FOLDERS]
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    return [str(p) for p in files if p.stat().st_mtime_ns >= start_ns]


@pytest.mark.process  # a ragen train in a subprocess
def test_a_run_prints_no_third_party_noise_at_the_default_verbosity(tmp_path, tiny_model_dir):
    """DeepSpeed's accelerator warning (when DS_ACCELERATOR is not set) and its "built successfully" line are not
    shown by `ragen train`; the run's own lines are, each iteration's on one line however long (its output is a
    pipe: the lines of three validation envs once wrapped at 160 columns, and grep lost their ends). The run,
    started as a user starts it (no TORCH_EXTENSIONS_DIR), uses the comm op ``make install`` built: it compiles
    nothing (no file of the op's folder written)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    installed = Path(sys.prefix) / "var" / "torch_extensions"
    assert list(installed.rglob("deepspeed_shm_comm*.so")), f"make install built no op in {installed}"
    start_ns = time.time_ns()
    unset = ("DS_ACCELERATOR", "PREFECT_API_URL", "PREFECT_HOME", "TORCH_EXTENSIONS_DIR")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    command = [
        str(Path(sys.executable).with_name("ragen")),
        "train",
        "--config",
        "configs/bandit.yaml",
        "--data-root",
        str(tmp_path / "root"),
        "--run-id",
        "quiet",
        f"model.path={tiny_model_dir}",
        "trainer.iterations=1",
        "bootstrap.enabled=false",
        "rollout.env_groups=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "actor.mini_batch_size=8",
        "actor.micro_batch_size=8",
        "eval.instances=4",
        "env.val_envs=[bandit, bandit_test, bandit_reversed]",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "iter   0" in done.stdout and "validation success" in done.stdout
    lines = [line for line in done.stdout.splitlines() if "/success " in line]
    assert [line[:8] for line in lines] == ["iter   0", "iter   1"], done.stdout
    assert max(len(line) for line in lines) > 160
    assert all(re.search(r" · bandit_reversed/success [\d.]+ · bandit_test/success [\d.]+$", line) for line in lines)
    assert "Setting accelerator" not in output and "built successfully" not in output, output[:2000]
    assert not _op_files_written_since(start_ns), "the run compiled DeepSpeed's op, not make install's"


def test_the_bootstrap_is_one_readable_line():
    from ragen_cli.summary import bootstrap_line

    built = {
        "run_id": "bootstrap-ab12",
        "cached": False,
        "demonstrations": 512,
        "sft_loss_first": 4.4467189,
        "sft_loss_last": 0.1081778,
    }
    assert bootstrap_line(built) == "bootstrap: bootstrap-ab12, 512 demonstrations, SFT loss 4.447 -> 0.108"
    assert bootstrap_line({"run_id": "bootstrap-ab12", "cached": True}) == "bootstrap: bootstrap-ab12 (reused)"


def test_a_table_narrower_than_its_cells_shows_every_character():
    """On an 60-column terminal a sweep's long run ids and overrides fold onto more lines; none ends in an ellipsis."""
    import pyarrow as pa
    from rich.console import Console

    from ragen_cli.common import print_table

    rows = [
        {
            "run_id": f"sweep-0123456789abcdef-p{i:03d}",
            "overrides": f"algorithm.filter_ratio=0.{i}5 seed={i}",
            "status": "completed",
            "val_success": 0.5,
        }
        for i in range(3)
    ]
    narrow = Console(width=60, record=True, color_system=None)
    print_table(pa.Table.from_pylist(rows), target=narrow)
    shown = narrow.export_text()
    assert "…" not in shown
    lines = [line.split("│") for line in shown.splitlines() if line.startswith("│")]
    columns = ["".join(cells[c].strip() for cells in lines) for c in (1, 2)]  # each column's cells, top to bottom
    for row in rows:
        assert row["run_id"] in columns[0] and row["overrides"].replace(" ", "") in columns[1], columns


def test_prefect_crash_lines_stay_off_the_terminal_and_other_engine_errors_do_not():
    """A SIGTERM that Prefect's own handler catches makes the engine log "Crash detected! ..." under
    ``prefect.engine`` (no run context then): the command says the stop in its one line, so the terminal filter drops
    that record; any other engine error, and the run loggers' warnings, still reach the terminal."""
    import logging

    from ragen_cli.launch import _NoRunRecords

    def record(name: str, level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, None, None)

    keep = _NoRunRecords().filter
    crash = "Crash detected! Execution was aborted by a termination signal."
    assert not keep(record("prefect.engine", logging.ERROR, crash))
    assert not keep(record("prefect.flow_runs", logging.ERROR, crash))
    assert not keep(record("prefect.task_runs", logging.INFO, "Finished in state Completed()"))
    assert keep(record("prefect.engine", logging.ERROR, "Engine execution exited with unexpected exception"))
    assert keep(record("prefect.engine", logging.WARNING, crash))  # only its error line is the crash report
    assert keep(record("prefect.flow_runs", logging.WARNING, "a run's own warning"))
    assert keep(record("ragen.monitor", logging.ERROR, crash))
