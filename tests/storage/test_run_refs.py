"""``[run:]<run id>[@<updates>]``: the one parser of a run reference (--init of retrain, the target of eval)."""

import pytest

from ragen_core.storage.names import RunRef, RunRefError, parse_run_ref, split_run_ref


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("run:abc@10", RunRef("abc", 10, True)),
        ("run:abc", RunRef("abc", None, True)),
        ("abc@0", RunRef("abc", 0, False)),
        ("sweep-1.a_b", RunRef("sweep-1.a_b", None, False)),
    ],
)
def test_a_well_formed_reference_names_its_run_and_checkpoint(text, expected):
    assert parse_run_ref(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run:abc@", "after '@' give the number of updates, e.g. run:abc@10"),
        ("abc@x", "after '@' give the number of updates, e.g. abc@10"),
        ("run:abc@\u0663", "after '@' give the number of updates"),  # an Arabic-Indic digit is no plain number
        ("run:x@1@2", "after '@' give the number of updates, e.g. run:x@10"),
        ("run:a/b@1", "'a/b' is not a run id"),
        ("run:", "'' is not a run id"),
        ("-rf", "'-rf' is not a run id"),
    ],
)
def test_a_malformed_reference_says_what_to_write(text, message):
    with pytest.raises(RunRefError, match="^" + message.replace("(", r"\(")):
        parse_run_ref(text)


def test_splitting_takes_the_first_at_and_one_prefix():
    assert split_run_ref("run:run:a@1") == ("run:a", "1")  # one "run:" is the prefix; the rest is the id (invalid)
    assert split_run_ref("a@1@2") == ("a", "1@2") and split_run_ref("a") == ("a", None)
