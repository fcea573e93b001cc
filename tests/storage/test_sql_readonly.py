"""``ragen sql`` cannot write or execute anything: a table of escapes, each refused through the real CLI with the
lake's files byte-identical afterwards; the connection itself (defense in depth) can open no new file."""

import hashlib
import os

import duckdb
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake, QueryRefused, check_read_only, connect
from tests.storage.synthetic import make_run, write_run


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    lake = DataLake(tmp_path_factory.mktemp("lake"))
    for seed, run_id in enumerate(("run-a", "run-b")):
        write_run(lake, make_run(seed, run_id, "bandit", iterations=1, groups=2, group_size=2))
    return lake.root


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """An empty current folder: DuckDB's default temporary folder (``.tmp``) and relative paths would land here."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _snapshot(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def _victim(root) -> str:
    """A published part file of the lake: the target an escape would overwrite."""
    return str(next(iter(sorted((root / "trajectories").rglob("part-*.parquet")))))


ESCAPES = [
    # (statement template, what DuckDB's parser calls it / why it is refused)
    ("EXPLAIN ANALYZE COPY (SELECT * FROM metrics) TO '{victim}' (FORMAT parquet)", "EXPLAIN of a COPY"),
    ("EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{victim}' (USE_TMP_FILE false)", "EXPLAIN of a COPY"),
    ("/* harmless */ explain\n  analyse copy (select 1) to '{root}/new.csv'", "EXPLAIN of a COPY"),
    ("EXPLAIN COPY (SELECT 1) TO '{root}/new.csv'", "EXPLAIN of a COPY"),
    ("EXPLAIN (FORMAT json) COPY (SELECT 1) TO '{root}/new.csv'", "EXPLAIN takes a plain query"),
    ("EXPLAIN ANALYZE WITH t AS (DELETE FROM metrics RETURNING *) SELECT * FROM t", "changes data (DELETE)"),
    ("WITH t AS (INSERT INTO metrics VALUES ('r', 0, 'm', 1.0) RETURNING *) SELECT * FROM t", "changes data (INSERT)"),
    ("SELECT 1; COPY (SELECT 1) TO '{victim}'", "exactly one query, not 2"),
    ("SELECT 1 AS a; EXPLAIN ANALYZE COPY (SELECT 1) TO '{root}/x.csv'", "exactly one query, not 2"),
    ("COPY trajectories TO '{victim}' (FORMAT parquet)", "COPY statements are refused"),
    ("COPY (SELECT 1) TO '.tmp/spill.csv'", "COPY statements are refused"),
    ("ATTACH '{root}/evil.duckdb' AS evil", "ATTACH statements are refused"),
    ("INSTALL httpfs", "LOAD statements are refused"),
    ("LOAD httpfs", "LOAD statements are refused"),
    ("SET enable_external_access = true", "SET statements are refused"),
    ("SET VARIABLE x = 1", "SET statements are refused"),
    ("RESET lock_configuration", "SET statements are refused"),
    ("PRAGMA enable_profiling", "PRAGMA statements are refused"),
    ("CALL pragma_version()", "CALL statements are refused"),
    ("EXPORT DATABASE '{root}/dump'", "EXPORT statements are refused"),
    ("IMPORT DATABASE '{root}'", "PRAGMA statements are refused"),
    ("CREATE TABLE t AS SELECT * FROM trajectories", "CREATE statements are refused"),
    ("DROP VIEW trajectories", "DROP statements are refused"),
    ("CHECKPOINT", "CALL statements are refused"),
]


@pytest.mark.parametrize(("template", "reason"), ESCAPES, ids=[t[:40] for t, _ in ESCAPES])
def test_every_escape_is_refused_and_the_lake_stays_byte_identical(root, workdir, template, reason):
    statement = template.format(root=root, victim=_victim(root))
    before, cwd_before = _snapshot(root), _snapshot(workdir)
    result = CliRunner().invoke(app, ["sql", statement, "--data-root", str(root)])
    assert result.exit_code == 2, result.output
    assert "query refused" in result.stderr and reason in result.stderr.replace("\n", " ")
    assert result.stdout == ""
    assert _snapshot(root) == before and _snapshot(workdir) == cwd_before


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM read_csv('/etc/hostname')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_json('{root}/runs/run-a/manifest.json')",
        "SELECT * FROM read_parquet('{root}/../*.parquet')",
        "SELECT * FROM sniff_csv('/etc/passwd')",
    ],
)
def test_reading_outside_the_published_files_is_refused(root, workdir, statement):
    result = CliRunner().invoke(app, ["sql", statement.format(root=root), "--data-root", str(root)])
    assert result.exit_code == 2 and "disabled by configuration" in result.stderr.replace("\n", " ")


def test_read_only_forms_still_run(root, workdir):
    before = _snapshot(root)
    for statement in (
        "EXPLAIN ANALYZE SELECT count(*) FROM trajectories WHERE split = 'train'",
        "explain select * from turns",
        "PIVOT metrics ON name IN ('m') USING sum(value)",
        "SELECT * FROM (SELECT 1 AS x) -- ; COPY (SELECT 1) TO 'x.csv'",
    ):
        result = CliRunner().invoke(app, ["sql", statement, "--data-root", str(root), "-f", "json"])
        assert result.exit_code == 0, (statement, result.output)
    assert _snapshot(root) == before and _snapshot(workdir) == {}


def test_what_runs_is_what_the_parser_checked():
    assert check_read_only("/* c */ explain -- x\n analyze select 1") == "EXPLAIN ANALYZE select 1"
    assert check_read_only("SELECT 1;") == "SELECT 1;"
    with pytest.raises(QueryRefused, match="EXPLAIN takes a plain query"):
        check_read_only("EXPLAIN (SELECT 1)")  # '(' could be options or a query: refused, not guessed


def test_the_connection_itself_opens_no_new_file(root, workdir):
    """Defense in depth under the parser: DuckDB may open only the views' files, spills nowhere, loads nothing."""
    before = _snapshot(root)
    con = connect(root)
    settings = dict(
        con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('temp_directory', 'enable_external_access', "
            "'lock_configuration', 'autoload_known_extensions', 'autoinstall_known_extensions', 'allowed_directories')"
        ).fetchall()
    )
    assert settings == {
        "temp_directory": "",
        "enable_external_access": "false",
        "lock_configuration": "true",
        "autoload_known_extensions": "false",
        "autoinstall_known_extensions": "false",
        "allowed_directories": "[]",
    }
    for target in (f"{root}/new.csv", f"{root}/trajectories/new.parquet", ".tmp/x.csv", "x.csv", f"{_victim(root)}"):
        with pytest.raises(duckdb.Error):
            con.execute(f"COPY (SELECT 1 AS x) TO '{target}'")
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET temp_directory = '/tmp'")
    with pytest.raises(duckdb.Error):
        con.execute("LOAD httpfs")
    assert _snapshot(root) == before and not os.listdir(workdir)
