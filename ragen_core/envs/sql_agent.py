"""SQL agent over DuckDB: a question about a small generated database, answered by querying it with tools.

An instance, drawn from the seed alone (nothing is downloaded): two tables of invented names (so no model knows the
answer beforehand), ``teams(team, city, budget)`` with ``teams`` rows and ``staff(name, team, salary, joined)`` with
``staff`` rows (every team has someone), and one question of the kinds in ``kinds``:

- ``count``: how many staff a team has;
- ``total``: the total salary of a team;
- ``top``: who earns the most in a team (salaries are distinct, so one name answers);
- ``city``: in which city a person works (a join of the two tables);
- ``since``: how many staff joined in or after a year.

Tools: ``list_tables()``, ``describe(table)``, ``query(sql)`` and ``answer(value)``, which ends the episode with
``correct_reward`` when the value is the question's answer (numbers compared as numbers, names without regard to
case), else 0. ``query`` runs one read-only statement (a SELECT, a WITH ... SELECT) in a DuckDB database built for
that call from the instance's rows, with one thread, ``memory_limit_mb`` of memory, no spilling to disk, no file,
network or extension access (locked, so the statement cannot turn it back on), stopped past ``query_timeout_s``;
it shows at most ``max_rows`` rows. Anything else (two statements, an INSERT, a COPY, a syntax error) is the
agent's error to read, never the run's. The answer is computed in Python from the rows, independently of DuckDB.

The expert (``expert_plan``, the teacher of ``teacher_mix``) runs the question's query, then answers with what it
returned. Instances are split between training and validation by the question and the data
(``held_out_maps``): validation never meets an instance that training or the bootstrap played.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ragen_core.envs.base import bounded, bounded_reward, register_env
from ragen_core.envs.invented import invented_words
from ragen_core.envs.tool_env import ToolEnv, tool
from ragen_core.tools import ToolCall, ToolResult

KINDS = ("count", "total", "top", "city", "since")
COLUMNS = {
    "teams": (("team", "VARCHAR"), ("city", "VARCHAR"), ("budget", "INTEGER")),
    "staff": (("name", "VARCHAR"), ("team", "VARCHAR"), ("salary", "INTEGER"), ("joined", "INTEGER")),
}
MAX_SQL = 1_000  # characters of one statement
MAX_CELL = 60  # characters of one value as the agent reads it
FIRST_YEAR, LAST_YEAR = 2001, 2024
_DECIMAL = re.compile(r"-?\d{1,30}(\.\d{1,30})?")


@dataclass(frozen=True)
class Database:
    """An instance's rows: ``teams`` (team, city, budget) and ``staff`` (name, team, salary, joined)."""

    teams: tuple[tuple[str, str, int], ...]
    staff: tuple[tuple[str, str, int, int], ...]

    def rows(self, table: str) -> tuple[tuple[Any, ...], ...]:
        return self.teams if table == "teams" else self.staff

    def digest(self) -> str:
        """A short SHA-256 of the rows: what, with the question, tells one instance from another."""
        return hashlib.sha256(repr((self.teams, self.staff)).encode()).hexdigest()[:16]


def generate_database(rng: np.random.Generator, teams: int, staff: int) -> Database:
    """``teams`` teams in distinct invented cities, ``staff`` people spread over them (each team has at least one),
    with distinct salaries (1,000 to 9,999) and a year joined (2001 to 2024)."""
    taken: set[str] = set()
    team_names = invented_words(rng, teams, 2, taken)
    cities = invented_words(rng, teams, 2, taken)
    budgets = [int(b) for b in rng.choice(np.arange(10, 100), size=teams, replace=False) * 1000]
    first, last = invented_words(rng, staff, 1, taken), invented_words(rng, staff, 2, taken)
    salaries = [int(s) for s in rng.choice(np.arange(1000, 10000), size=staff, replace=False)]
    homes = [*range(teams), *(int(t) for t in rng.integers(teams, size=staff - teams))]
    rng.shuffle(homes)
    people = tuple(
        (f"{first[i]} {last[i]}", team_names[homes[i]], salaries[i], int(rng.integers(FIRST_YEAR, LAST_YEAR + 1)))
        for i in range(staff)
    )
    return Database(tuple(zip(team_names, cities, budgets, strict=True)), people)


def question_of(rng: np.random.Generator, db: Database, kind: str) -> tuple[str, str, str]:
    """(the question, the SQL that answers it, its answer computed from the rows in Python) of ``kind``."""
    team = db.teams[int(rng.integers(len(db.teams)))][0]
    members = [p for p in db.staff if p[1] == team]
    if kind == "count":
        sql = f"SELECT count(*) FROM staff WHERE team = '{team}'"
        return f"How many staff are in team {team}?", sql, str(len(members))
    if kind == "total":
        sql = f"SELECT sum(salary) FROM staff WHERE team = '{team}'"
        return f"What is the total salary of team {team}?", sql, str(sum(p[2] for p in members))
    if kind == "top":
        sql = f"SELECT name FROM staff WHERE team = '{team}' ORDER BY salary DESC LIMIT 1"
        return f"Who earns the most in team {team}?", sql, max(members, key=lambda p: p[2])[0]
    if kind == "city":
        person = db.staff[int(rng.integers(len(db.staff)))]
        city = next(t[1] for t in db.teams if t[0] == person[1])
        sql = f"SELECT city FROM teams JOIN staff USING (team) WHERE name = '{person[0]}'"
        return f"In which city does {person[0]} work?", sql, city
    year = int(rng.integers(FIRST_YEAR, LAST_YEAR + 1))
    sql = f"SELECT count(*) FROM staff WHERE joined >= {year}"
    return f"How many staff joined in or after {year}?", sql, str(sum(p[3] >= year for p in db.staff))


def run_query(db: Database, sql: str, max_rows: int, timeout_s: float, memory_limit_mb: int) -> str:
    """The result of one read-only statement over ``db`` as the agent reads it (a header, at most ``max_rows``
    rows, a count); a ValueError of one line for a statement that is not one SELECT, fails, or runs past
    ``timeout_s`` (module docstring)."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_SQL:
        raise ValueError(f"a query is one SQL statement of 1 to {MAX_SQL} characters")
    config = {"threads": 1, "memory_limit": f"{memory_limit_mb}MB", "max_temp_directory_size": "0B"}
    con = duckdb.connect(":memory:", config=config)
    timer = threading.Timer(timeout_s, con.interrupt)
    try:
        _load(con, db)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        statements = con.extract_statements(sql)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise ValueError("only one read-only statement (SELECT ...) is allowed")
        timer.start()
        cursor = con.execute(sql)
        header = [d[0] for d in cursor.description]
        rows = cursor.fetchmany(max_rows + 1)
    except duckdb.InterruptException:
        raise ValueError(f"the query ran past {timeout_s:g} s and was stopped") from None
    except duckdb.Error as exc:
        raise ValueError(" ".join(str(exc).split())[:300]) from None
    finally:
        timer.cancel()
        con.close()
    return _table_text(header, rows, max_rows)


def _load(con: Any, db: Database) -> None:
    """The instance's tables in ``con``, typed as :data:`COLUMNS` says."""
    for table, columns in COLUMNS.items():
        con.execute(f"CREATE TABLE {table} ({', '.join(f'{n} {t}' for n, t in columns)})")
        marks = ", ".join("?" for _ in columns)
        con.executemany(f"INSERT INTO {table} VALUES ({marks})", [list(row) for row in db.rows(table)])


def _table_text(header: list[str], rows: list[tuple[Any, ...]], max_rows: int) -> str:
    lines = [" | ".join(header)]
    lines += [" | ".join(_cell(v) for v in row) for row in rows[:max_rows]]
    shown = f"({len(rows)} row{'s' if len(rows) != 1 else ''})"
    if len(rows) > max_rows:
        shown = f"(the first {max_rows} rows; add a WHERE or a LIMIT to see others)"
    return "\n".join([*lines, shown])


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def same_answer(given: str, expected: str) -> bool:
    """Whether ``given`` answers ``expected``: equal numbers (``12``, ``12.0``), or the same text without regard to
    case, surrounding blanks or quotes."""
    given, expected = given.strip().strip("'\""), expected.strip()
    if _DECIMAL.fullmatch(given) and _DECIMAL.fullmatch(expected):  # plain decimals only: "1e999999999" is text
        return Fraction(given) == Fraction(expected)
    return given.casefold() == expected.casefold()


@register_env("sql_agent")
class SqlAgentEnv(ToolEnv):
    """A question over a generated DuckDB database, answered with SQL tools (module docstring)."""

    name = "sql_agent"
    held_out_maps = True

    def __init__(
        self,
        teams: int = 4,
        staff: int = 12,
        kinds: str = "count,total,top,city,since",
        max_rows: int = 20,
        query_timeout_s: float = 2.0,
        memory_limit_mb: int = 64,
        correct_reward: float = 1.0,
    ) -> None:
        self.teams = bounded("teams", teams, 1, 50)
        self.staff = bounded("staff", staff, self.teams, 500)
        chosen = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else []
        if not chosen or any(k not in KINDS for k in chosen):
            raise ValueError(f"kinds must be a comma-separated list of {', '.join(KINDS)}, got {kinds!r}")
        self.kinds = tuple(dict.fromkeys(chosen))
        self.max_rows = bounded("max_rows", max_rows, 1, 200)
        self.query_timeout_s = float(bounded("query_timeout_s", query_timeout_s, 0.01, 60, integer=False))
        self.memory_limit_mb = bounded("memory_limit_mb", memory_limit_mb, 16, 4096)
        self.correct_reward = bounded_reward("correct_reward", correct_reward)
        if self.correct_reward <= 0:
            raise ValueError(f"correct_reward must be above 0, got {correct_reward!r}")
        self.db = Database((), ())
        self.question, self.gold_sql, self.gold = "", "", ""
        self.results: list[str] = []
        self.won = False

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Draw the instance of ``seed``: its database, then its question (module docstring)."""
        rng = np.random.default_rng(seed)
        self.db = generate_database(rng, self.teams, self.staff)
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        self.question, self.gold_sql, self.gold = question_of(rng, self.db, kind)
        self.results, self.won = [], False
        return self.render(), {"success": False}

    def render(self) -> str:
        return self.question

    def map_key(self) -> str:
        """The question and a digest of the rows (``held_out_maps``)."""
        return f"{self.question} {self.db.digest()}"

    def instruction(self) -> str:
        return (
            "Answer the question about the database with the tools: look at its tables, query it with SQL, one call "
            "per reply, then call answer with the result."
        )

    def brief(self) -> str:
        return "Query the database, then answer."

    @property
    def success(self) -> bool:
        return self.won

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, self.correct_reward

    def success_from_reward(self, env_reward: float) -> bool | None:
        return env_reward == self.correct_reward

    def end_reason(self) -> str:
        return "success" if self.won else "wrong_answer"

    @tool
    def list_tables(self) -> str:
        """List the database's tables."""
        return ", ".join(COLUMNS)

    @tool(name="describe")
    def describe_table(self, table: str) -> str:
        """Show a table's columns and their types.

        Args:
            table: the table's name, as list_tables shows it
        """
        if table not in COLUMNS:
            raise ValueError(f"no table {table!r}; tables: {', '.join(COLUMNS)}")
        return "\n".join(f"{name} {kind}" for name, kind in COLUMNS[table])

    @tool
    def query(self, sql: str) -> str:
        """Run one read-only SQL query (DuckDB's dialect) and show its rows.

        Args:
            sql: one SELECT statement, e.g. SELECT name FROM staff LIMIT 3
        """
        result = run_query(self.db, sql, self.max_rows, self.query_timeout_s, self.memory_limit_mb)
        self.results.append(result)
        return result

    @tool
    def answer(self, value: str) -> ToolResult:
        """Give the final answer to the question; this ends the episode.

        Args:
            value: the answer: a number or a name
        """
        self.won = same_answer(value, self.gold)
        return ToolResult(f"{value} is {'right' if self.won else 'wrong'}.", self.correct_reward * self.won, done=True)

    def expert_plan(self, actions_left: int) -> list[str]:
        """The question's query unless its result has been shown, then the answer."""
        answer = ToolCall("answer", {"value": self.gold}).text()
        shown = any(self.gold in result.splitlines()[1:2] for result in self.results)
        return [answer] if shown else [ToolCall("query", {"sql": self.gold_sql}).text(), answer]

    def teacher_actions(self, actions_left: int) -> list[str] | None:
        """The expert's next call."""
        return self.expert_plan(actions_left)[:1]

    def sample_action(self, rng: np.random.Generator) -> str:
        """A plausible call, well-formed and mostly wrong: a look at the tables, a query of another team or person's
        kind, or an answer with a number of the rows."""
        roll = rng.random()
        if roll < 0.2:
            return ToolCall("describe", {"table": list(COLUMNS)[int(rng.integers(len(COLUMNS)))]}).text()
        if roll < 0.6:
            _, sql, _ = question_of(rng, self.db, self.kinds[int(rng.integers(len(self.kinds)))])
            return ToolCall("query", {"sql": sql}).text()
        return ToolCall("answer", {"value": str(int(rng.integers(len(self.db.staff) + 1)))}).text()
