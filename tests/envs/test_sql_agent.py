"""The SQL agent env: its databases and questions (answers recomputed here from the rows, and by DuckDB from the
expert's query), its read-only, bounded query tool, its answer check, its expert and its held-out split."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.held_out import is_validation_map, split_seeds
from ragen_core.envs.sql_agent import KINDS, Database, generate_database, run_query, same_answer
from ragen_core.tools import ToolCall

HAND = Database(
    teams=(("Alpha", "Orr", 20000), ("Beta", "Vel", 50000)),
    staff=(("Ann Lee", "Alpha", 3000, 2010), ("Bo Kim", "Alpha", 5000, 2020), ("Cy Dee", "Beta", 4000, 2015)),
)


def _call(env, name, **arguments):
    _, reward, done, _, info = env.step(ToolCall(name, arguments).text())
    return info["tool_call"], reward, done


def _value(result: str) -> str:
    """The one value of a one-row, one-column result."""
    lines = result.splitlines()
    assert lines[-1] == "(1 row)", result
    return lines[1]


def test_queries_over_a_hand_made_database_give_the_hand_computed_rows():
    assert _value(run_query(HAND, "SELECT sum(salary) FROM staff WHERE team = 'Alpha'", 20, 2, 64)) == "8000"
    joined = run_query(HAND, "SELECT name, city FROM staff JOIN teams USING (team) ORDER BY name", 20, 2, 64)
    assert joined.splitlines() == ["name | city", "Ann Lee | Orr", "Bo Kim | Orr", "Cy Dee | Vel", "(3 rows)"]
    assert run_query(HAND, "SELECT count(*) AS n FROM staff WHERE joined >= 2015", 20, 2, 64) == "n\n2\n(1 row)"


def test_at_most_max_rows_are_shown_and_the_cut_is_said():
    lines = run_query(HAND, "SELECT * FROM range(100) t(i)", 5, 2, 64).splitlines()
    assert lines[:6] == ["i", "0", "1", "2", "3", "4"]
    assert lines[6] == "(the first 5 rows; add a WHERE or a LIMIT to see others)" and len(lines) == 7


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("DROP TABLE staff", "only one read-only statement"),
        ("INSERT INTO staff VALUES ('X', 'Alpha', 1, 2000)", "only one read-only statement"),
        ("SELECT 1; DELETE FROM staff", "only one read-only statement"),
        ("SET enable_external_access = true", "only one read-only statement"),
        ("COPY staff TO 'out.csv'", "only one read-only statement"),
        ("ATTACH 'other.db'", "only one read-only statement"),
        ("INSTALL httpfs", "only one read-only statement"),
        ("SELEC name FROM staff", "syntax error"),
        ("SELECT nope FROM staff", "nope"),
        ("", "one SQL statement of 1 to"),
    ],
)
def test_anything_but_one_select_is_the_agents_error(sql, said):
    with pytest.raises(ValueError, match=said):
        run_query(HAND, sql, 20, 2, 64)


def test_a_select_cannot_read_files(tmp_path, monkeypatch):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n42\n")
    monkeypatch.chdir(tmp_path)
    for sql in (f"SELECT * FROM read_csv('{secret}')", "SELECT * FROM 'secret.csv'"):
        with pytest.raises(ValueError, match="disabled by configuration"):
            run_query(HAND, sql, 20, 2, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv"]  # and nothing was spilled beside it


def test_a_long_query_is_stopped_and_a_large_one_is_bounded_in_memory():
    started = time.monotonic()
    with pytest.raises(ValueError, match="ran past 0.2 s and was stopped"):
        run_query(HAND, "SELECT count(*) FROM range(1000000000000)", 20, 0.2, 64)
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="Out of Memory"):
        run_query(HAND, "SELECT * FROM range(100000000) ORDER BY random()", 20, 30, 16)


@pytest.mark.parametrize(
    ("given", "expected", "same"),
    [
        ("12", "12", True),
        ("12.0", "12", True),
        (" '12' ", "12", True),
        ("13", "12", False),
        ("ann lee", "Ann Lee", True),
        ('"Ann Lee"', "Ann Lee", True),
        ("Ann", "Ann Lee", False),
        ("1e999999999", "12", False),  # text, not a number of a billion digits
    ],
)
def test_answers_match_as_numbers_or_as_names(given, expected, same):
    assert same_answer(given, expected) is same


def test_every_team_has_staff_and_salaries_are_distinct():
    for seed in range(50):
        db = generate_database(np.random.default_rng(seed), 5, 12)
        assert {p[1] for p in db.staff} == {t[0] for t in db.teams}
        assert len({p[2] for p in db.staff}) == 12 and len({p[0] for p in db.staff}) == 12
        assert all(2001 <= p[3] <= 2024 and 1000 <= p[2] <= 9999 for p in db.staff)


def _python_answer(db: Database, question: str) -> str:
    """The question's answer recomputed from its words and the rows (independently of the env's own)."""
    words = question.rstrip("?").split()
    if question.startswith("How many staff are in team"):
        return str(sum(p[1] == words[-1] for p in db.staff))
    if question.startswith("What is the total salary"):
        return str(sum(p[2] for p in db.staff if p[1] == words[-1]))
    if question.startswith("Who earns the most"):
        return max((p for p in db.staff if p[1] == words[-1]), key=lambda p: p[2])[0]
    if question.startswith("In which city"):
        person = " ".join(words[4:6])
        team = next(p[1] for p in db.staff if p[0] == person)
        return next(t[1] for t in db.teams if t[0] == team)
    return str(sum(p[3] >= int(words[-1]) for p in db.staff))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_answered_by_its_query_and_the_expert_solves_it_in_two_calls(kind):
    env = make_env("sql_agent", kinds=kind)
    for seed in range(15):
        question, _ = env.reset(seed)
        assert env.gold == _python_answer(env.db, question), question
        assert _value(run_query(env.db, env.gold_sql, 20, 2, 64)) == env.gold  # DuckDB agrees with Python
        calls = []
        for _ in range(3):
            action = env.teacher_actions(3)[0]
            calls.append(ToolCall.from_text(action).name)
            _, reward, done, _, info = env.step(action)
            if done:
                break
        assert calls == ["query", "answer"] and reward == 1.0 and env.success and env.end_reason() == "success"


def test_the_tools_describe_the_database_and_a_wrong_answer_ends_the_episode_unrewarded():
    env = make_env("sql_agent")
    env.reset(3)
    assert _call(env, "list_tables")[0]["result"] == "teams, staff"
    assert _call(env, "describe", table="staff")[0]["result"].splitlines()[2] == "salary INTEGER"
    record, _, done = _call(env, "describe", table="nope")
    assert record["error"] == "raised" and "no table 'nope'" in record["result"] and not done
    record, _, done = _call(env, "query", sql="DROP TABLE staff")
    assert record["error"] == "raised" and not done
    record, reward, done = _call(env, "answer", value="not it")
    assert (record["result"], reward, done, env.success) == ("not it is wrong.", 0.0, True, False)


def test_the_random_policy_writes_calls_that_parse():
    env = make_env("sql_agent")
    env.reset(0)
    rng = np.random.default_rng(0)
    for _ in range(30):
        assert env.parse_action(env.sample_action(rng)) is not None


def test_options_are_checked_in_one_line():
    with pytest.raises(ValueError, match="kinds must be a comma-separated list of count, total"):
        make_env("sql_agent", kinds="count,median")
    with pytest.raises(ValueError, match="staff must be a whole number from 4"):
        make_env("sql_agent", teams=4, staff=3)


def test_validation_instances_are_held_out_by_question_and_rows():
    env = make_env("sql_agent")
    keys = []
    for seed in range(200):
        env.reset(seed)
        keys.append(env.map_key())
    assert len(set(keys)) == 200
    val = split_seeds("sql_agent", {}, list(range(50)), "val")
    train = split_seeds("sql_agent", {}, list(range(50)), "train")
    for seeds, held_out in ((val, True), (train, False)):
        for seed in seeds:
            env.reset(seed)
            assert is_validation_map(env.map_key()) is held_out
