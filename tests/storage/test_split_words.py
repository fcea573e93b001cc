"""No run id the project derives holds a split word of Hugging Face ``datasets`` (issue 40, section 4 item 2): the
words and separators are ``datasets``' own, :func:`split_word_in` agrees with what ``datasets`` makes a split of (it
is asked, folder by folder), and :func:`without_split_words` leaves none."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_core.config import build_config
from ragen_core.run.record import default_run_id
from ragen_core.storage.names import SPLIT_SEPARATORS, SPLIT_WORDS, split_word_in, without_split_words

NAMES = [
    "bandit-1d924c33-20261125T001504",
    "eval-bandit-ab12cd34",
    "evaluate-bandit-ab12cd34",
    "my-test-run",
    "test",
    "bandit_test-x",
    "x.dev",
    "v2-val3",
    "training",
    "retrain-sft-ab12cd34",
    "attest",
    "evalrun",
    "bandit_TEST",
    "sweep-ab12cd34-p000",
    "bandit_tst-x",
    "devel-1",
    "validation_a",
    "x_valid",
    "testing.1",
    "pre-evaluation",
]


def test_the_split_words_and_separators_are_those_of_datasets():
    data_files = pytest.importorskip("datasets.data_files")
    words = {word for split_words in data_files.SPLIT_KEYWORDS.values() for word in split_words}
    assert set(SPLIT_WORDS) == words
    assert set(SPLIT_SEPARATORS) == set(data_files.NON_WORDS_CHARS.replace("0-9", "0123456789"))


@pytest.mark.parametrize("name", NAMES)
def test_a_run_folder_is_a_split_for_datasets_exactly_when_its_name_holds_a_split_word(name, tmp_path):
    data_files = pytest.importorskip("datasets.data_files")
    for run in ("plain", name):  # a table folder of two runs, as the lake lays them out
        folder = tmp_path / f"run-{run}" / "iteration-0"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), folder / "part-0123456789ab-00000.parquet")
    patterns = data_files.get_data_patterns(str(tmp_path))
    assert (patterns != {"train": ["**"]}) == (split_word_in(f"run-{name}") is not None), patterns


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*SPLIT_WORDS, "a", "run", "bandit", "x", "tr", "ain", "Test", *SPLIT_SEPARATORS])))
def test_names_written_short_hold_no_split_word(pieces):
    name = "".join(pieces)
    short = without_split_words(name)
    assert split_word_in(short) is None
    if split_word_in(name) is None:
        assert short == name  # a name without split words is left as it is


@pytest.mark.parametrize("env", ["bandit", "bandit_test", "sokoban_new_vocab"])
def test_a_default_run_id_holds_no_split_word(env):
    run_id = default_run_id(build_config({"env": {"name": env}}))
    assert split_word_in(run_id) is None
    assert run_id.startswith({"bandit_test": "bandit_tst-"}.get(env, f"{env}-"))
