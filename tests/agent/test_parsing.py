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


def test_lenient_tolerates_text_around_the_tags_and_truncation():
    text = "Sure! <think>hmm</think>\n<answer>Right</answer> done"
    parsed = parse_response(text, ACTIONS, 1, reply_format="lenient", finished=False)
    assert parsed.actions == ["Right"] and parsed.valid and turn_penalty(parsed, -0.1) == 0.0


# The demo's collapsed replies: a right answer, then the same text again until the token limit.
RUN_ON = "<think>I will take Up.</think><answer>Up</answer>I will take Up.</think><answer>Up</answer>I will"


@pytest.mark.parametrize(
    ("text", "finished"),
    [
        ("Sure! <think>hmm</think><answer>Right</answer>", True),  # text before the tags
        ("<think>hmm</think><answer>Right</answer> done", True),  # text after them
        (RUN_ON, True),
        (RUN_ON, False),
        ("<think>hmm</think><answer>Right</answer>", False),  # well formed, but cut at the limit: no end token
    ],
)
def test_strict_needs_the_whole_reply_in_the_format_and_an_end(text, finished):
    parsed = parse_response(text, ACTIONS, 1, finished=finished)  # strict is the default
    assert not parsed.format_ok and not parsed.valid and parsed.actions == []
    assert turn_penalty(parsed, -0.1) == -0.1
    assert parsed.answer in ("Right", "Up")  # still read, for the diagnostics


def test_strict_allows_whitespace_around_a_finished_reply():
    parsed = parse_response(" \n<think>hmm</think>\n<answer>Right</answer>\n ", ACTIONS, 1, finished=True)
    assert parsed.actions == ["Right"] and parsed.valid


def test_an_unknown_reply_format_is_refused():
    with pytest.raises(ValueError, match="strict, lenient"):
        parse_response("<think>x</think><answer>Up</answer>", ACTIONS, 1, reply_format="loose")


def test_invalid_action_is_reported_and_penalised():
    parsed = parse_response("<think>x</think><answer>Up || Jump</answer>", ACTIONS, 3)
    assert parsed.actions == ["Up"] and parsed.invalid_actions == ["Jump"]
    assert parsed.format_ok and not parsed.valid and turn_penalty(parsed, -0.1) == -0.1


def test_answer_only_mode():
    parsed = parse_response("<answer>Down</answer>", ACTIONS, 1, enable_think=False)
    assert parsed.actions == ["Down"] and parsed.think == "" and parsed.valid
