"""The calculator env: its evaluator (exact, nothing eval-ed), its problems (answers recomputed from the question's
words), its tools, its expert and teacher, and its held-out split."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.calculator import MAX_EXPRESSION, evaluate, format_number
from ragen_core.envs.held_out import is_validation_map, split_seeds
from ragen_core.tools import ToolCall


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("947 + 2444", Fraction(3391)),
        ("3391 - 2960", Fraction(431)),
        ("(1200 + 34) * 2", Fraction(2468)),
        ("7 / 2", Fraction(7, 2)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("-(3 - 5) * -2", Fraction(-4)),
        ("  12  ", Fraction(12)),
    ],
)
def test_the_evaluator_is_exact(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["2 ** 10", "1e3", "0x10", "1_000", "abs(-1)", "x + 1", "__import__('os')", "[1] * 3", "1 if 1 else 2", "1 +", ""],
)
def test_anything_but_arithmetic_is_refused(expression):
    with pytest.raises(ValueError):
        evaluate(expression)


def test_division_by_zero_and_length_are_refused():
    with pytest.raises(ZeroDivisionError):
        evaluate("1 / (2 - 2)")
    with pytest.raises(ValueError, match=f"at most {MAX_EXPRESSION} characters"):
        evaluate("1+" * 150 + "1")
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        evaluate("(" * 99 + "1" + ")" * 98)


def test_numbers_are_shown_whole_or_as_exact_decimals():
    assert [format_number(Fraction(n)) for n in ("12", "7/2", "1/8", "-3/4")] == ["12", "3.5", "0.125", "-0.75"]
    assert format_number(Fraction(10, 3)) == "3.33333333333"


PHRASES = {
    r"receives (\d+) more": "+",
    r"buys (\d+)": "+",
    r"sells (\d+)": "-",
    r"gives away (\d+)": "-",
    r"gets (\d+) times as many": "*",
}


def _answer_from_words(question: str) -> int:
    """The question's answer, read from its words alone: the starting count, then each event applied in order."""
    value = int(re.search(r"has (\d+)", question).group(1))
    events = []
    for pattern, operation in PHRASES.items():
        events += [(m.start(), operation, int(m.group(1))) for m in re.finditer(pattern, question)]
    for _, operation, number in sorted(events):
        value = {"+": value + number, "-": value - number, "*": value * number}[operation]
    return value


@pytest.mark.parametrize(
    "options", [{}, {"steps": 3, "operations": "+-*"}, {"steps": 1, "min_number": 10, "max_number": 50}]
)
def test_the_expert_solves_every_problem_and_the_answer_is_the_words(options):
    env = make_env("calculator", **options)
    for seed in range(200):
        question, _ = env.reset(seed)
        truth = _answer_from_words(question)
        assert truth >= 0 and len(env.chain) == env.steps
        for call in env.expert_plan(10):
            _, reward, terminated, _, info = env.step(call)
            assert info["tool_call"]["error"] is None
        assert terminated and env.success and reward == 1.0 and env.chain[-1] == truth
        assert env.expert_plan(10) == [ToolCall("answer", {"value": truth}).text()]


def test_the_expert_goes_on_from_what_is_computed():
    env = make_env("calculator")
    env.reset(3)
    first, second, answer = env.expert_plan(10)
    env.step(first)
    assert env.expert_plan(10) == [second, answer] and env.teacher_actions(10) == [second]
    env.step(ToolCall("calculate", {"expression": "1 + 1"}).text())  # a detour changes nothing of the plan
    assert env.expert_plan(10) == [second, answer]


def test_a_wrong_answer_ends_the_episode_unsolved():
    env = make_env("calculator")
    question, _ = env.reset(4)
    state, reward, terminated, _, info = env.step(ToolCall("answer", {"value": -1}).text())
    assert (reward, terminated, env.success, env.end_reason()) == (0.0, True, False, "wrong_answer")
    assert info["tool_call"]["result"] == "-1 is wrong." and state == f"{question}\nanswer(-1): -1 is wrong."
    assert env.success_from_reward(0.0) is False and env.success_from_reward(1.0) is True


def test_a_bad_expression_is_the_tool_raising_told_to_the_agent():
    env = make_env("calculator")
    env.reset(0)
    state, reward, terminated, _, info = env.step(ToolCall("calculate", {"expression": "2 ** 8"}).text())
    record = info["tool_call"]
    assert (record["error"], reward, terminated) == ("raised", 0.0, False)
    assert record["result"].startswith("error: calculate raised ValueError: only numbers")
    assert state == env.question  # nothing was computed


def test_random_calls_are_well_formed_and_use_the_question_s_numbers():
    env = make_env("calculator")
    rng = np.random.default_rng(0)
    for seed in range(50):
        question, _ = env.reset(seed)
        call = ToolCall.from_text(env.sample_action(rng))
        assert env.parse_action(call.text()) == call.text()
        numbers = re.findall(r"\d+", call.arguments.get("expression", str(call.arguments.get("value"))))
        assert numbers and all(n in question for n in numbers)


def test_options_are_bounded():
    for options, message in (
        ({"steps": 0}, "steps must be a whole number from 1 to 10"),
        ({"operations": "+^"}, "operations must be some of"),
        ({"min_number": 50, "max_number": 10}, "min_number must be a whole number from 1 to 9"),
        ({"correct_reward": 0}, "correct_reward must be above 0"),
    ):
        with pytest.raises(ValueError, match=message):
            make_env("calculator", **options)


def test_validation_problems_are_held_out_by_their_text():
    train = split_seeds("calculator", {}, list(range(64)), "train")
    val = split_seeds("calculator", {}, list(range(64)), "val")
    env = make_env("calculator")
    questions = {"train": set(), "val": set()}
    for side, seeds in (("train", train), ("val", val)):
        for seed in seeds:
            env.reset(seed)
            assert is_validation_map(env.question) == (side == "val")
            questions[side].add(env.question)
    assert not questions["train"] & questions["val"]
