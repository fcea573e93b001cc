"""The DuckDB catalog is read-only and can be scoped to one run."""

import duckdb
import pytest

from ragen_core.storage import DataLake, QueryRefused, check_read_only, connect, query
from tests.storage.synthetic import make_run, write_run


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    lake = DataLake(tmp_path_factory.mktemp("lake"))
    for seed, run_id in enumerate(("run-a", "run-b")):
        write_run(lake, make_run(seed, run_id, "bandit", iterations=1, groups=2, group_size=2))
    return lake


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("COPY (SELECT * FROM trajectories) TO 'x.parquet'", "COPY"),
        ("INSERT INTO metrics VALUES ('r', 0, 'm', 1.0)", "INSERT"),
        ("ATTACH 'other.db' AS other", "ATTACH"),
        ("CREATE TABLE t AS SELECT 1", "CREATE"),
        ("DROP VIEW trajectories", "DROP"),
        ("SET enable_external_access = true", "SET"),
        ("INSTALL httpfs", "LOAD"),
        ("EXPORT DATABASE 'dump'", "EXPORT"),
        ("PRAGMA database_list", "PRAGMA"),
    ],
)
def test_statements_that_are_not_queries_are_refused(lake, statement, kind):
    with pytest.raises(QueryRefused, match=f"{kind} statements are refused: the lake is read-only"):
        query(lake, statement)


def test_several_statements_are_refused_even_when_the_first_is_a_query(lake):
    with pytest.raises(QueryRefused, match="exactly one query, not 2"):
        query(lake, "SELECT 1; DROP VIEW trajectories")


@pytest.mark.parametrize(
    "statement",
    [
        "WITH t AS (SELECT * FROM trajectories) SELECT count(*) FROM t",
        "DESCRIBE turns",
        "SHOW TABLES",
        "SUMMARIZE metrics",
        "EXPLAIN SELECT * FROM trajectories",
        "FROM metrics LIMIT 1",
        "SELECT 1;",
    ],
)
def test_queries_of_every_read_only_form_run(lake, statement):
    check_read_only(statement)
    assert query(lake, statement).num_rows >= 1


def test_a_query_cannot_read_files_outside_the_data_root(lake):
    with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
        query(lake, "SELECT * FROM read_csv('/etc/hostname')")


def test_a_plain_connection_cannot_change_its_settings_or_write_outside(lake, tmp_path):
    con = connect(lake)
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.PermissionException):
        con.execute(f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'")
    assert con.execute("SELECT count(*) FROM trajectories").fetchone() == (2 * (4 + 2 * 6),)  # 2x2 train + 2 x 3x2 val


def test_run_scope_filters_every_table(lake):
    per_table = "SELECT '{t}' AS t, count(*) AS n, count(DISTINCT run_id) AS runs FROM {t}"
    tables = ("trajectories", "turns", "metrics", "evaluations", "runs")
    statement = " UNION ALL ".join(per_table.format(t=t) for t in tables)
    everything = {r["t"]: r for r in query(lake, statement).to_pylist()}
    scoped = {r["t"]: r for r in query(lake, statement, run_id="run-a").to_pylist()}
    for table in tables:
        assert everything[table]["runs"] == 2 and scoped[table]["runs"] == 1, table
        expected = sum(1 for _ in lake.read_table(table, "run-a").to_pylist())
        assert scoped[table]["n"] == expected > 0, table
    (only,) = query(lake, "SELECT DISTINCT run_id FROM turns", run_id="run-b").to_pylist()
    assert only == {"run_id": "run-b"}


def test_a_query_scoped_to_one_iteration_lists_that_partition_and_only_the_tables_named(lake):
    counts = query(lake, "SELECT iteration, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1", run_id="run-a")
    whole = dict(zip(counts["iteration"].to_pylist(), counts["n"].to_pylist(), strict=True))
    assert len(whole) == 2, "the premise: the run has two iterations of trajectories"
    one = query(
        lake,
        "SELECT DISTINCT run_id, iteration, count(*) OVER () AS n FROM trajectories",
        run_id="run-a",
        iteration=1,
        tables=("trajectories",),
    )
    assert one.to_pylist() == [{"run_id": "run-a", "iteration": 1, "n": whole[1]}]
    with pytest.raises(duckdb.CatalogException, match="metrics"):
        query(lake, "SELECT count(*) FROM metrics", run_id="run-a", iteration=1, tables=("trajectories",))
    with pytest.raises(ValueError, match="give run_id= too"):
        query(lake, "SELECT 1", iteration=1)


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("SELECT count(*) FROM metrics", {"metrics"}),
        ('SELECT * FROM "Trajectories" t JOIN RUNS r USING (run_id)', {"trajectories", "runs"}),
        (
            "WITH t AS (SELECT run_id FROM turns) SELECT (SELECT count(*) FROM events) AS n FROM t "
            "WHERE run_id IN (SELECT run_id FROM evaluations)",
            {"t", "turns", "events", "evaluations"},
        ),
        ("SELECT 1", set()),
        ("SELECT * FROM duckdb_views()", None),  # a table function: the tree cannot say what it shows
        ("SELECT * FROM information_schema.tables", None),
        ("SELECT * FROM main.metrics", None),
        ("SHOW TABLES", None),
        ("DESCRIBE turns", None),
        ("EXPLAIN SELECT * FROM metrics", None),
    ],
)
def test_the_tables_a_statement_names_come_from_its_parse_tree(statement, named):
    from ragen_core.storage.statements import referenced_tables

    assert referenced_tables(statement) == (None if named is None else frozenset(named))


def _views_made(monkeypatch) -> list[str]:
    from ragen_core.storage import catalog

    made: list[str] = []
    create = catalog._create_view
    monkeypatch.setattr(
        catalog, "_create_view", lambda con, lake, spec, *a: made.append(spec.name) or create(con, lake, spec, *a)
    )
    return made


def test_a_query_opens_the_views_of_the_tables_it_names_alone(lake, monkeypatch):
    every = connect(lake)  # every view, made before the count of views starts
    metrics = every.execute("SELECT count(*) FROM metrics WHERE run_id = 'run-a'").fetchone()[0]
    turns = every.execute("SELECT count(*) FROM turns").fetchone()[0]
    made = _views_made(monkeypatch)
    assert query(lake, "SELECT count(*) AS n FROM metrics WHERE run_id = 'run-a'")["n"].to_pylist() == [metrics]
    assert made == ["metrics"]
    made.clear()
    rows = query(lake, "SELECT (SELECT count(*) FROM turns) AS n FROM runs WHERE run_id = 'run-a'")["n"].to_pylist()
    assert rows == [turns] and sorted(made) == ["runs", "turns"]
    made.clear()  # a statement whose tree cannot say: every table's view, so the catalog lists them all
    shown = query(lake, "SELECT view_name FROM duckdb_views() WHERE NOT internal")["view_name"].to_pylist()
    assert set(lake.tables) <= set(shown) and sorted(made) == sorted(lake.tables)


def test_a_name_the_parse_tree_missed_gets_every_view_and_a_wrong_one_keeps_duckdbs_message(lake, monkeypatch):
    from ragen_core.storage import catalog

    expected = connect(lake).execute("SELECT count(*) FROM metrics").fetchone()[0]
    monkeypatch.setattr(catalog, "referenced_tables", lambda statement: frozenset())  # a tree that shows no table
    made = _views_made(monkeypatch)
    assert query(lake, "SELECT count(*) AS n FROM metrics")["n"].to_pylist() == [expected] and expected > 0
    assert made == list(lake.tables)  # none for the first try, then every view for the second
    monkeypatch.undo()
    with pytest.raises(duckdb.CatalogException, match='Did you mean "metrics"'):  # suggested from every view
        query(lake, "SELECT * FROM metric")
