"""The dataset env: prompts from a JSONL or Parquet file, answers scored by the user's reward function, one or
several turns (ragen_core/envs/dataset.py), and the shipped arithmetic example."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples.arithmetic.make_prompts import prompt_rows
from examples.arithmetic.reward import score
from ragen_core.config import ConfigError
from ragen_core.envs import make_env
from ragen_core.envs.external import UserCodeError
from ragen_core.run.checks import build_run_config, load_run_config
from tests.envs.user_code import unique

ROWS = [
    {"prompt": "2 + 3 = ?", "solution": 5, "level": "easy"},
    {"prompt": "9 + 9 = ?", "solution": 18, "level": "hard"},
    {"prompt": "0 + 4 = ?", "solution": 4, "level": "easy"},
]
REWARD = """
calls = []


def exact(completion, solution, **columns):
    calls.append((completion, solution, columns))
    if completion == str(solution):
        return 1.0, "Right."
    return (0.5, "Close.") if completion.isdigit() and abs(int(completion) - solution) == 1 else 0.0


def too_big(completion, **columns):
    return 3.0


def not_a_number(completion, **columns):
    return "yes"


def only_the_answer(completion):
    return 1.0


def off_by(rng, solution, **columns):
    return f" {solution + int(rng.integers(1, 3))} "


def no_text(rng, **columns):
    return 7
"""


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A reward module on the import path, and the rows as JSONL and Parquet files."""
    module = unique("user_rewards")
    (tmp_path / f"{module}.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in ROWS) + "\n")
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    return {"module": module, "jsonl": jsonl, "parquet": parquet}


def _env(user, file: str = "jsonl", function: str = "exact", **options):
    return make_env("dataset", data_file=str(user[file]), reward_fn=f"{user['module']}:{function}", **options)


@pytest.mark.parametrize("file", ["jsonl", "parquet"])
def test_each_row_is_an_instance_and_the_other_columns_reach_the_reward(user, file):
    env = _env(user, file, answer_column="solution")
    assert [env.reset(seed)[0] for seed in (0, 1, 2, 3, 7)] == [
        "2 + 3 = ?",
        "9 + 9 = ?",
        "0 + 4 = ?",
        "2 + 3 = ?",
        "9 + 9 = ?",
    ]
    state, reward, terminated, truncated, info = env.step(" 18 ")
    assert (state, reward, terminated, truncated, info["success"]) == (
        "9 + 9 = ?\nFeedback: Right.",
        1.0,
        True,
        False,
        True,
    )
    calls = __import__(user["module"]).calls
    assert calls[-1] == ("18", 18, {"level": "hard"})  # every column but the prompt, the answer stripped
    assert env.success and env.expert_plan(1) == ["18"] and env.teacher_actions(1) == ["18"]


def test_several_turns_show_the_feedback_until_an_answer_solves_it(user):
    env = _env(user)
    env.reset(0)
    assert env.step("4")[:3] == ("2 + 3 = ?\nFeedback: Close.", 0.5, False)
    assert env.step("7")[:3] == ("2 + 3 = ?\nFeedback: Your answer scored 0.", 0.0, False)  # a bare score's text
    assert env.step("")[:3] == ("2 + 3 = ?\nFeedback: Your answer scored 0.", 0.0, False)  # no answer: invalid
    assert not env.success
    assert env.step("5")[:3] == ("2 + 3 = ?\nFeedback: Right.", 1.0, True) and env.success
    assert env.reward_bounds(3) == (0.0, 3.0)
    assert _env(user, reward_range=[-1, 1]).reward_bounds(3) == (-3.0, 3.0)


def test_the_random_policy_answers_with_other_rows_answers(user):
    env = _env(user, answer_column="solution")
    env.reset(0)
    drawn = {env.sample_action(np.random.default_rng(seed)) for seed in range(50)}
    assert drawn == {"5", "18", "4"}
    with pytest.raises(ValueError, match="play env.options.answer_column: set it"):
        _env(user).sample_action(np.random.default_rng(0))


def test_a_tasks_own_wrong_answers_replace_other_rows_answers(user):
    env = _env(user, answer_column="solution", wrong_answer_fn=f"{user['module']}:off_by")
    env.reset(1)  # 9 + 9: the function adds 1 or 2 to the row's solution, drawn from the policy's generator
    for seed in range(20):
        assert env.sample_action(np.random.default_rng(seed)) == str(
            18 + int(np.random.default_rng(seed).integers(1, 3))
        )
    assert env.expert_plan(1) == ["18"]  # the expert and the teacher still play the reference answer
    broken = _env(user, answer_column="solution", wrong_answer_fn=f"{user['module']}:no_text")
    broken.reset(2)
    with pytest.raises(UserCodeError) as caught:
        broken.sample_action(np.random.default_rng(0))
    assert str(caught.value) == (
        f"wrong-answer function {user['module']}:no_text on row 3 of {broken.data_file} returned 7: return the "
        "answer's text"
    )


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("too_big", "returned 3, outside env.options.reward_range [0, 1]"),
        ("not_a_number", "returned 'yes': return a number, or (number, feedback text)"),
    ],
)
def test_a_reward_out_of_its_range_or_not_a_number_is_refused(user, function, expected):
    env = _env(user, function=function)
    env.reset(0)
    with pytest.raises(UserCodeError) as caught:
        env.step("5")
    reward = f"{user['module']}:{function}"
    assert str(caught.value) == f"reward function {reward} on row 1 of {env.data_file}, answer '5', {expected}"


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        build_run_config(overrides=["env.name=dataset", *overrides])
    return str(caught.value).splitlines()[-1].strip()


def test_a_malformed_reward_function_or_file_is_one_line_before_any_compute(user, tmp_path):
    file, module = f"env.options.data_file={user['jsonl']}", user["module"]
    assert _refusal([file, "env.options.reward_fn=rewards.exact"]) == (
        "env.options.reward_fn: 'rewards.exact' is not an import path: write package.module:Name (e.g. "
        "my_rewards.math:score), the module importable (installed, or its folder on PYTHONPATH)"
    )
    missing = _refusal([file, "env.options.reward_fn=no_such_rewards_4711:f"])
    assert "cannot import module 'no_such_rewards_4711'" in missing
    assert f"{module!r} has no attribute 'missing'" in _refusal([file, f"env.options.reward_fn={module}:missing"])
    assert f"{module}:calls' is not a function" in _refusal([file, f"env.options.reward_fn={module}:calls"])
    assert "cannot be called as reward(completion, level=..., solution=...)" in _refusal(
        [file, f"env.options.reward_fn={module}:only_the_answer"]
    )
    assert "needs env.options.data_file" in _refusal([f"env.options.reward_fn={module}:exact"])
    reward = f"env.options.reward_fn={module}:exact"
    absent = _refusal([f"env.options.data_file={tmp_path}/none.jsonl", reward])
    assert f"{str(tmp_path / 'none.jsonl')!r} is not a file" in absent
    assert "is neither Parquet nor JSONL" in _refusal([f"env.options.data_file={tmp_path}/rows.csv", reward])
    assert "row 1 of" in _refusal([file, reward, "env.options.prompt_column=question"])
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1 + 1 = ?"}\n[1, 2]\n')
    assert "line 2 of" in _refusal([f"env.options.data_file={broken}", reward])
    wrong = [file, reward, "env.options.answer_column=solution", f"env.options.wrong_answer_fn={module}:"]
    assert "cannot be called as wrong(rng, level=..., solution=...)" in _refusal(
        [*wrong[:3], wrong[3] + "only_the_answer"]
    )
    assert _refusal([*wrong[:3], wrong[3] + "no_text"]) == (
        f"env.options.wrong_answer_fn: wrong-answer function {module}:no_text on row 1 of {file.split('=', 1)[1]} "
        "returned 7: return the answer's text"
    )
    broken.write_text('{"prompt": "1 + 1 = ?"}\n' * 20 + '{"prompt": "2 + 2 = ?", solution: 4}\n')
    refused = _refusal([f"env.options.data_file={broken}", reward])
    # one line number, the file's: the decoder's own "line 1 column 26" would contradict it
    assert (
        f"line 21 of {str(broken)!r} is not JSON: Expecting property name enclosed in double quotes at column 25"
        in refused
    )
    assert refused.count("line") == 1 and refused.count(str(broken)) == 1


def test_the_shipped_arithmetic_example_is_a_valid_config_and_its_reward_is_exact():
    config = load_run_config("configs/dataset_arithmetic.yaml")
    env = make_env(config.env.name, **config.env.options)
    rows = [json.loads(line) for line in open(config.env.options["data_file"])]
    assert rows == prompt_rows(1000, 9, 0)  # the shipped file is the generator's output
    for seed in range(20):
        row = rows[seed]
        assert env.reset(seed)[0] == row["prompt"] == f"{row['a']} + {row['b']} = ?"
        assert env.expert_plan(1) == [str(row["a"] + row["b"])]
    assert score("12", solution=12) == (1.0, "Correct.")
    assert score("11", solution=12) == (0.0, "Too low.") and score("13", solution=12) == (0.0, "Too high.")
    assert score("twelve", solution=12) == (0.0, "Not a whole number.")
