import pytest

from ragen_core.agent import parse_response, turn_penalty

ACTIONS = ["Up", "Down", "Left", "Right"]


def test_well_formed():
    parsed = parse_response("<think>go up</think><answer>Up</answer>", ACTIONS, 3)
    assert (parsed.think, parsed.answer, parsed.actions, parsed.valid) == ("go up", "Up", ["Up"], True)


def test_multiple_actions_are_split_stripped_and_matched_case_insensitively():
    parsed = parse_response("<think>x</think> <answer> up || LEFT ||down </answer>", ACTIONS, 5)
    assert parsed.actions == ["Up", "Left", "Down"] and parsed.valid


def test_too_many_actions_are_truncated():
    parsed = parse_response("<think>x</think><answer>Up || Up || Left || Right</answer>", ACTIONS, 2)
    assert parsed.actions == ["Up", "Up"] and parsed.valid


@pytest.mark.parametrize(
    "text",
    [
        "Up",
        "<answer>Up</answer>",  # think required
        "<think>x</think>",
        "<think>x</think><answer></answer>",
        "<think>x<answer>Up</answer>",
        "<think>x</think><answer>Up",
    ],
)
def test_malformed_replies_fail_the_format(text):
    parsed = parse_response(text, ACTIONS, 3)
    assert not parsed.valid
    assert turn_penalty(parsed, -0.1) == -0.1


def test_extra_text_around_the_tags_is_tolerated():
    parsed = parse_response("Sure! <think>hmm</think>\n<answer>Right</answer> done", ACTIONS, 1)
    assert parsed.actions == ["Right"] and parsed.valid and turn_penalty(parsed, -0.1) == 0.0


def test_invalid_action_is_reported_and_penalised():
    parsed = parse_response("<think>x</think><answer>Up || Jump</answer>", ACTIONS, 3)
    assert parsed.actions == ["Up"] and parsed.invalid_actions == ["Jump"]
    assert parsed.format_ok and not parsed.valid and turn_penalty(parsed, -0.1) == -0.1


def test_answer_only_mode():
    parsed = parse_response("<answer>Down</answer>", ACTIONS, 1, enable_think=False)
    assert parsed.actions == ["Down"] and parsed.think == "" and parsed.valid
