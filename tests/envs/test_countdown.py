from fractions import Fraction

import pytest

from ragen_core.envs import make_env
from ragen_core.envs.countdown import EquationError, parse_equation


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("1 + 2 * 3", 7, (1, 2, 3)),
        ("(1 + 2) * 3", 9, (1, 2, 3)),
        ("20 - 6 / 4", Fraction(37, 2), (20, 6, 4)),
        ("8 / (3 - 1) - 2", 2, (8, 3, 1, 2)),
        ("((7))", 7, (7,)),
        ("44 + 19 + 35 = 98", 98, (44, 19, 35)),
        ("10 - 4 - 3", 3, (10, 4, 3)),  # left associative
        ("12 / 3 / 2", 2, (12, 3, 2)),
    ],
)
def test_parse_equation_by_hand(text, value, numbers):
    parsed = parse_equation(text)
    assert parsed.value == value and parsed.numbers == numbers


@pytest.mark.parametrize(
    "text",
    ["", "1 +", "(1 + 2", "1 + 2)", "2 ** 3", "__import__('os')", "1 2", "-1 + 2", "3 + x", "1e9", "7 = 8 = 9"],
)
def test_parse_equation_rejects_anything_else(text):
    with pytest.raises(EquationError):
        parse_equation(text)


def test_division_by_zero_has_no_value():
    assert parse_equation("5 / (2 - 2)").value is None


def test_rewards_follow_the_reference():
    env = make_env("countdown")
    env.reset(0)
    numbers, target = env.instance.numbers, env.instance.target
    solution = env.expert_plan(1)[0]
    assert env.score(solution) == 1.0
    wrong = " + ".join(str(n) for n in numbers)
    assert env.score(wrong) == (1.0 if sum(numbers) == target else 0.1)
    assert env.score(" + ".join(str(n) for n in numbers[:-1])) == 0.0  # a number left out
    assert env.score(f"{wrong} + {numbers[0]}") == 0.0  # a number used twice
    assert env.score("not an equation") == 0.0
    _, reward, terminated, _, info = env.step(solution)
    assert reward == 1.0 and terminated and info["success"] and info["action_is_valid"]


def test_invalid_answer_is_flagged_and_keeps_the_episode_open():
    env = make_env("countdown")
    env.reset(1)
    assert env.parse_action("the answer is 42") is None
    _, reward, terminated, _, info = env.step("the answer is 42")
    assert reward == 0.0 and not terminated and info["action_is_valid"] is False


def test_instances_have_3_or_4_numbers_and_a_reachable_target():
    env = make_env("countdown")
    sizes = set()
    for seed in range(300):
        env.reset(seed)
        numbers, target = env.instance.numbers, env.instance.target
        sizes.add(len(numbers))
        assert all(1 <= n <= 99 for n in numbers) and 1 <= target <= 99
        solution = env.expert_plan(1)[0]
        parsed = parse_equation(solution)
        assert sorted(parsed.numbers) == sorted(numbers) and parsed.value == target
    assert sizes == {3, 4}


def test_random_valid_policy_writes_well_formed_equations_over_the_numbers():
    import numpy as np

    env = make_env("countdown")
    rng = np.random.default_rng(0)
    scores = []
    for seed in range(200):
        env.reset(seed)
        answer = env.sample_action(rng)
        assert sorted(parse_equation(answer).numbers) == sorted(env.instance.numbers)
        scores.append(env.score(answer))
    assert set(scores) <= {0.1, 1.0} and scores.count(0.1) > 150
