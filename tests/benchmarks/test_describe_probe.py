"""``python -m benchmarks.describe_probe``: targets and bad input (the description: tests/envs/test_frozen_lake.py)."""

from __future__ import annotations

import pytest

from benchmarks.describe_probe import PROMPTS, described_prompts, main
from ragen_core.envs import make_env
from ragen_core.policy.tiny import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(1024)


@pytest.mark.parametrize("kind", PROMPTS)
def test_targets_cover_exactly_the_description_tokens(tokenizer, kind):
    ids, mask, targets, descriptions = described_prompts(tokenizer, range(3), kind)
    env = make_env("frozen_lake")
    for row, description in enumerate(descriptions):
        scored = targets[row][targets[row] != -100].tolist()
        assert tokenizer.decode(scored) == description + "</think>"
        # each target is the next input token (teacher forcing) and the padding is never scored
        positions = (targets[row] != -100).nonzero().flatten()
        assert ids[row][positions + 1].tolist() == scored and mask[row][positions].all()
        end = int(positions[0]) + 1  # the last prompt token predicts the description's first
        prompt = tokenizer.decode(ids[row][:end][mask[row][:end].bool()])
        state, _ = env.reset(row)
        assert prompt.startswith("<|im_start|>") and prompt.endswith("<think>") and f"\n{state}" in prompt
        assert ("The symbols of the state are" in prompt) == (kind == "full")


@pytest.mark.parametrize("argv", [["--layers", "0"], ["--hidden", "30"], ["--lr", "0"], ["--held-out", "0"]])
def test_bad_arguments_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and "must be" in capsys.readouterr().err
