"""A real bootstrap (scripted demonstrations stored in a lake, then SFT through a DeepSpeed engine) on clean teacher
replies: the bootstrapped model starts its replies with the thinking it was shown, never with an end of reply."""

import re
from pathlib import Path

import torch

from ragen_core.config import load_config
from ragen_core.policy import load_policy
from ragen_core.run.bootstrap import bootstrap_model
from ragen_core.storage import DataLake, query

OVERRIDES = [
    "env.options.is_slippery=false",
    "env.max_turns=10",
    "env.max_actions_per_turn=1",
    "rollout.prompt_style=compact",
    "rollout.context_window_mode=single_turn",
    "rollout.max_context_window=1",
    "actor.micro_batch_size=16",
    "actor.mini_batch_size=16",
    "trainer.num_threads=1",
    "bootstrap.enabled=true",
    "bootstrap.policy=teacher_mix",
    "bootstrap.teacher_prob=1.0",
    "bootstrap.num_groups=48",
    "bootstrap.group_size=1",
    "bootstrap.epochs=20",
    "bootstrap.batch_size=16",
]


def test_a_bootstrap_on_clean_teacher_replies_answers_in_format(tiny_model_dir: Path, tmp_path: Path):
    config = load_config("configs/frozenlake.yaml", OVERRIDES)
    lake = DataLake(tmp_path / "lake")
    lines = []
    target, summary = bootstrap_model(config, lake, tiny_model_dir, report=lines.append)
    assert not summary["cached"] and summary["sft_loss_last"] < summary["sft_loss_first"] / 3
    # a line per step: what is built, the demonstrations stored, then one per epoch with the summary's losses
    assert lines[0] == (
        f"bootstrap {summary['run_id']}: 48 demonstrations of the teacher_mix scripted policy on "
        f"{config.env.name}, then 20 SFT epoch(s)"
    )
    assert re.fullmatch(r"bootstrap: demonstrations stored \(\d+ s\)", lines[1]) and len(lines) == 22
    epochs = [re.fullmatch(r"bootstrap: SFT epoch (\d+)/20, loss (\S+) \(\d+ s\)", line) for line in lines[2:]]
    assert [int(m.group(1)) for m in epochs] == list(range(1, 21))
    assert epochs[0].group(2) == f"{summary['sft_loss_first']:.3f}"
    assert epochs[-1].group(2) == f"{summary['sft_loss_last']:.3f}"
    model, tokenizer = load_policy(target)
    rows = query(
        lake,
        "SELECT input_ids, loss_mask, segment_lengths FROM trajectories WHERE run_id = $run",
        params={"run": summary["run_id"]},
    ).to_pylist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    think = tokenizer.encode("The", add_special_tokens=False)[0]
    ends, firsts = [], []
    for row in rows:
        start = 0
        for length in row["segment_lengths"]:
            ids, mask = row["input_ids"][start : start + length], row["loss_mask"][start : start + length]
            prompt = ids[: mask.index(1)]
            assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>")
            assert ids[mask.index(1)] == think  # the demonstration goes on with its description, not an end
            with torch.no_grad():
                probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1], dim=-1)
            ends.append(float(probs[end]))
            firsts.append(float(probs[think]))
            start += length
    assert len(ends) > 60
    assert max(ends) < 0.01 and min(firsts) > 0.9  # the model learned what follows <think>: its description


def test_demonstrations_longer_than_the_token_limit_are_warned_of(tiny_model_dir: Path, tmp_path: Path, caplog):
    """Sudoku's random demonstrations place up to 5 cells a turn (replies of 24-84 tokens): under a 64-token limit
    the model would learn replies it cannot finish. Built and cached bootstraps both warn, with the share counted
    here from the stored turns."""
    import logging

    overrides = [
        f"model.path={tiny_model_dir}",
        "bootstrap.num_groups=16",
        "bootstrap.group_size=2",
        "bootstrap.epochs=1",
        "trainer.num_threads=1",
    ]
    lake = DataLake(tmp_path / "lake")
    config = load_config("configs/sudoku.yaml", [*overrides, "rollout.max_new_tokens=64"])
    with caplog.at_level(logging.WARNING, logger="ragen.bootstrap"):
        _, summary = bootstrap_model(config, lake, tiny_model_dir)
    lengths = [
        row["response_tokens"]
        for row in query(
            lake, "SELECT response_tokens FROM turns WHERE run_id = $run", params={"run": summary["run_id"]}
        ).to_pylist()
    ]
    over = sum(n > 64 for n in lengths) / len(lengths)
    assert 0 < over < 1 and max(lengths) > 64
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "ragen.bootstrap"]
    assert warning.startswith(
        f"bootstrap: {over:.0%} of the demonstrated replies are longer than "
        f"rollout.max_new_tokens=64 (the longest {max(lengths)} tokens"
    )
    caplog.clear()
    roomy = load_config("configs/sudoku.yaml", [*overrides, f"rollout.max_new_tokens={max(lengths)}"])
    with caplog.at_level(logging.WARNING, logger="ragen.bootstrap"):
        _, cached = bootstrap_model(roomy, lake, tiny_model_dir)  # the same bootstrap (the limit is not in its key)
    assert cached == {"run_id": summary["run_id"], "cached": True}
    assert [r for r in caplog.records if r.name == "ragen.bootstrap"] == []
