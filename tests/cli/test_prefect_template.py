"""The ready Prefect database (ragen_cli/prefect_template.py): taken from the first temporary server on an empty home,
copied into the next new home; a damaged template costs nothing but the slower start."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ragen_cli import prefect_template
from ragen_cli.local_server import start_temporary


def _schema(database: Path) -> tuple[list, list, list]:
    """(migration revision, table names, ids of the registered block types) of a Prefect database. Block types get
    random ids when registered, so equal ids mean one database is a copy of the other."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
        tables = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        return revision, tables, sorted(r[0] for r in db.execute("SELECT id FROM block_type"))


def _bogus_template(database: Path) -> None:
    """A whole SQLite file at a migration revision Prefect does not know: no server starts from it."""
    database.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(database)) as db:
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("INSERT INTO alembic_version VALUES ('0000deadbeef')")
        db.commit()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "cache"))
    return prefect_template.template_dir()


@pytest.mark.server  # temporary Prefect servers
def test_a_bad_template_is_replaced_by_a_fresh_database_and_the_next_server_starts_from_it(tmp_path, cache):
    _bogus_template(cache / "prefect.db")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    server = start_temporary(first, timeout=300)  # seeded, the server fails; the retry migrates an empty home
    try:
        revision, tables, blocks = _schema(first / "prefect.db")
        assert revision != [("0000deadbeef",)] and "flow_run" in tables and blocks
        assert _schema(cache / "prefect.db") == (revision, tables, blocks)  # kept as the new template
        assert (cache / "memo_store.toml").is_file() and not list(cache.glob("*.tmp"))
    finally:
        server.stop()
    server = start_temporary(second, timeout=300)
    try:
        assert _schema(second / "prefect.db") == (revision, tables, blocks)  # the same block-type ids: a copy
    finally:
        server.stop()


def test_a_template_that_is_no_database_is_dropped_before_any_copy(tmp_path, cache):
    cache.mkdir(parents=True)
    (cache / "prefect.db").write_bytes(b"not a database" * 100)
    assert not prefect_template.seed(tmp_path)
    assert not (cache / "prefect.db").exists() and not (tmp_path / "prefect.db").exists()


def test_a_database_with_flow_runs_never_becomes_the_template(tmp_path, cache):
    home = tmp_path / "home"
    home.mkdir()
    with closing(sqlite3.connect(home / "prefect.db")) as db:
        db.execute("CREATE TABLE flow_run (id TEXT)")
        db.execute("INSERT INTO flow_run VALUES ('a run')")
        db.commit()
    prefect_template.save(home)
    assert not (cache / "prefect.db").exists() and not list(cache.glob("*"))


def test_no_template_where_it_cannot_be_kept(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "file"))  # a file where the folder would be
    home = tmp_path / "home"
    home.mkdir()
    (home / "prefect.db").write_bytes(b"")
    prefect_template.save(home)  # best effort: nothing raised, nothing written
    assert not prefect_template.seed(tmp_path)
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://u@127.0.0.1/db")
    assert prefect_template.template_dir() is None  # not a SQLite file in the home: nothing to copy
