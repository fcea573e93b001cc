"""The MI diagnostic as RAGEN-2 computes it (issue 31 item 3): the reasoning is the think block's content only (checked
against RAGEN-2's regex on the decoded reply), the per-token and summed estimates equal a port of RAGEN-2's
CollapseDetector, its multi-turn trajectory-uniform sample (every draw its own prompt column) and the config rules."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from ragen_core.config import ConfigError, build_config, stored_config
from ragen_core.monitor.diagnostics import (
    every_turn_reasoning,
    first_turn_reasoning,
    reasoning_mi,
    sampled_turns,
    think_content,
    turn_replies,
)


def ragen2_reasoning_text(reply_text: str, think_in_prompt: bool) -> str:
    """RAGEN-2's ctx_manager: '<think>' put back before a prefixed reply, the first <think>(.*?)</think> match, the
    special tokens removed, stripped ('' when there is no match)."""
    text = ("<think>" + reply_text) if think_in_prompt else reply_text
    match = re.search(r"<think>(.*?)</think>", text, re.DOTALL)
    content = match.group(1) if match else ""
    for special in ["<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>"]:
        content = content.replace(special, "")
    return content.strip()


@pytest.mark.parametrize(
    "reply_text, think_in_prompt",
    [
        ("I go left, then up.</think><answer>Left</answer><|im_end|>", True),
        ("  push the box down  </think> <answer>Down</answer>", True),
        ("<think>the goal is right</think><answer>Right</answer>", False),
        ("no closing tag <answer>Left</answer>", True),
        ("<answer>Left</answer>", False),  # no think block at all
        ("   </think><answer>Up</answer>", True),  # only whitespace inside: left out
    ],
)
def test_think_content_is_ragen2s_reasoning(tiny_policy, reply_text, think_in_prompt):
    _, tokenizer = tiny_policy
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    reply = tuple(tokenizer.encode(reply_text))
    expected = ragen2_reasoning_text(tokenizer.decode(list(reply)), think_in_prompt)
    # RAGEN-2's ids: the stripped text tokenised again
    assert think_content(reply, tokenizer.decode, think_in_prompt, encode) == (
        tuple(encode(expected)) if expected else ()
    )
    exact = think_content(reply, tokenizer.decode, think_in_prompt)  # token-exact: sampled ids inside the block
    if not expected:
        assert exact == ()
        return
    start = next(k for k in range(len(reply)) if reply[k : k + len(exact)] == exact)
    assert reply[start : start + len(exact)] == exact
    text = tokenizer.decode(list(exact)).strip()
    assert expected.startswith(text) and len(expected) - len(text) <= 2  # a token straddling </think> is left out


def test_first_turn_reasoning_drops_replies_without_a_block(tiny_policy):
    _, tokenizer = tiny_policy
    good = tokenizer.encode("left first</think><answer>Left</answer>")
    bad = tokenizer.encode("<answer>Left</answer>")
    ids = [[7, 8, *good], [7, 8, *bad]]
    masks = [[0, 0] + [1] * len(good), [0, 0] + [1] * len(bad)]
    _, content = first_turn_reasoning(ids, masks, tokenizer.decode, "content", True, tokenizer.encode)
    assert tokenizer.decode(list(content[0])).strip() == "left first" and content[1] == ()
    _, block = first_turn_reasoning(ids, masks, tokenizer.decode, "block", True)
    assert block[1] == tuple(bad)  # the earlier span: the whole reply without a tag
    _, off = first_turn_reasoning(ids, masks, None, "content", True)
    assert off == [(), ()]  # thinking off: RAGEN-2 has no reasoning to score


def ragen2_collapse(prompts, reasonings, group_ids, table):
    """A port of RAGEN-2's CollapseDetector._compute_metrics_for_pairs: every sample scored under every group's
    prompt (columns = unique group ids, the prompt of the group's first sample); matched vs logsumexp - log N, on
    per-token means (mi_estimate) and on sums (mi_seq_estimate)."""
    columns = sorted(set(group_ids))
    prompt_of = {g: prompts[group_ids.index(g)] for g in columns}
    sums = torch.tensor([[table(prompt_of[g], z) for g in columns] for z in reasonings], dtype=torch.float64)
    lengths = torch.tensor([len(z) for z in reasonings], dtype=torch.float64).clamp(min=1)
    means = sums / lengths[:, None]
    col = torch.tensor([columns.index(g) for g in group_ids])
    rows = torch.arange(len(reasonings))
    n = len(columns)

    def mi(values):
        return float((values[rows, col] - (torch.logsumexp(values, dim=1) - math.log(n))).mean())

    return {"mi_estimate": mi(means), "mi_seq_estimate": mi(sums), "mi_upper_bound": math.log(n)}


def random_table(seed: int):
    rng = np.random.default_rng(seed)
    cache = {}

    def table(x, z):
        if (x, z) not in cache:
            cache[x, z] = float(-rng.uniform(0.5, 3.0) * len(z))
        return cache[x, z]

    return table


@pytest.mark.parametrize("seed", range(5))
def test_per_token_and_summed_estimates_equal_ragen2s(seed):
    rng = np.random.default_rng(seed)
    groups, size = int(rng.integers(2, 7)), int(rng.integers(1, 5))
    prompts = [(g, 900 + g) for g in range(groups) for _ in range(size)]
    reasonings = [tuple(rng.integers(1, 50, size=int(rng.integers(1, 9))).tolist()) for _ in prompts]
    group_ids = [g for g in range(groups) for _ in range(size)]
    table = random_table(seed)
    expected = ragen2_collapse(prompts, reasonings, group_ids, table)
    estimate = reasoning_mi(
        prompts, reasonings, lambda pairs: np.array([table(x, z) for x, z in pairs]), max_prompts=groups
    )  # every prompt a candidate, as RAGEN-2
    assert estimate.mi_per_token == pytest.approx(expected["mi_estimate"], abs=1e-9)
    assert estimate.mi == pytest.approx(expected["mi_seq_estimate"], abs=1e-9)
    assert estimate.bound == pytest.approx(expected["mi_upper_bound"])


def test_multi_turn_columns_are_the_draws_as_in_ragen2():
    # two draws of one (prompt, reasoning) pair are two columns in RAGEN-2 (group ids = arange), not one
    prompts = [(1,), (1,), (2,), (3,)]
    reasonings = [(5, 6), (5, 6), (7,), (8, 9, 4)]
    table = random_table(11)
    expected = ragen2_collapse(prompts, reasonings, [0, 1, 2, 3], table)
    score = lambda pairs: np.array([table(x, z) for x, z in pairs])  # noqa: E731
    estimate = reasoning_mi(prompts, reasonings, score, max_prompts=4, columns=range(4))
    assert estimate.prompts == 4 and estimate.mi_per_token == pytest.approx(expected["mi_estimate"], abs=1e-9)
    assert estimate.mi == pytest.approx(expected["mi_seq_estimate"], abs=1e-9)
    by_content = reasoning_mi(prompts, reasonings, score, max_prompts=4)  # the first-turn rule: 3 distinct prompts
    assert by_content.prompts == 3 and by_content.mi != pytest.approx(estimate.mi)


def test_turn_replies_by_hand():
    ids = [1, 2, 10, 11, 3, 4, 12, 5, 13, 14]
    mask = [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert turn_replies(ids, mask) == [
        ((1, 2), (10, 11)),
        ((1, 2, 10, 11, 3, 4), (12,)),
        ((1, 2, 10, 11, 3, 4, 12, 5), (13, 14)),
    ]
    assert turn_replies([1, 2], [0, 0]) == []


def test_every_turn_reasoning_keeps_the_turns_with_a_block(tiny_policy):
    _, tokenizer = tiny_policy
    first, second = tokenizer.encode("go up</think><answer>Up</answer>"), tokenizer.encode("<answer>Up</answer>")
    env = [3, 4]
    ids = [7, 8, *first, *env, *second]
    mask = [0, 0] + [1] * len(first) + [0, 0] + [1] * len(second)
    turns = every_turn_reasoning([ids], [mask], tokenizer.decode, "content", True)
    assert len(turns[0]) == 1 and turns[0][0][0] == (7, 8)
    assert tokenizer.decode(list(turns[0][0][1])).strip() == "go up"


def test_sampled_turns_are_trajectory_uniform():
    # Pr(m, t) = 1/M * 1/T_m (RAGEN-2's _sample_trajectory_uniform): M = 3 trajectories with 1, 2 and 0 turns
    turns = [[("a", "z0")], [("b", "z1"), ("c", "z2")], []]
    assert len(sampled_turns(turns, None, 0)) <= 3  # draws = total turns (3); a draw of the empty one gives nothing
    counts = Counter(x for x, _ in sampled_turns(turns, 30_000, 1))  # capped at the 3 turns there are
    assert sum(counts.values()) <= 3
    turns_many = [[("a", "z")] * 1000, [("b", "z")] * 500 + [("c", "z")] * 500, []]  # 2000 turns: 2000 draws max
    draws = [x for x, _ in sampled_turns(turns_many, None, 2)]
    frequencies = {k: v / 2000 for k, v in Counter(draws).items()}
    expected = {"a": 1 / 3, "b": 1 / 6, "c": 1 / 6}  # the third trajectory's third of the draws gives no pair
    for key, p in expected.items():
        assert frequencies[key] == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / 2000))
    assert sampled_turns(turns_many, None, 2) == sampled_turns(turns_many, None, 2)  # seeded


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.mi_multi_turn=true"], "set trainer.mi_diagnostic=true"),
        (["trainer.mi_diagnostic=true", "trainer.mi_samples=64"], "set trainer.mi_multi_turn=true"),
        (
            [
                "trainer.mi_diagnostic=true",
                "trainer.mi_multi_turn=true",
                "rollout.context_window_mode=single_turn",
                "rollout.max_context_window=2",
            ],
            "context_window_mode=single_turn",
        ),
        (["trainer.mi_reasoning=tags"], "mi_reasoning"),
        (["monitor.mi_metric=mean"], "mi_metric"),
    ],
)
def test_bad_mi_keys_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(overrides=overrides)


def test_ragen2s_behaviour_is_the_default_and_old_runs_keep_theirs():
    config = build_config()
    assert (config.trainer.mi_reasoning, config.monitor.mi_metric, config.trainer.mi_multi_turn) == (
        "content",
        "per_token",
        False,
    )
    old = build_config(stored_config({"trainer": {"mi_diagnostic": True}}))  # a run stored before the keys
    assert (old.trainer.mi_reasoning, old.monitor.mi_metric) == ("block", "sequence")


def test_a_multi_turn_run_stores_the_sampled_variant(prefect_harness, tmp_path, tiny_model_dir):
    from flows.train import train
    from ragen_core.storage import query

    config = {
        "model": {"path": str(tiny_model_dir)},
        "env": {"name": "sokoban", "val_envs": ["sokoban"], "max_turns": 2, "max_actions_per_traj": 2},
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 1, "mi_diagnostic": True, "mi_multi_turn": True, "mi_reasoning": "block"},
        "eval": {"every": 1, "instances": 2},
    }
    train(config, data_root=str(tmp_path), run_id="mt")
    stored = {
        r["name"]: r["value"]
        for r in query(
            tmp_path, "SELECT name, value FROM metrics WHERE iteration = 0 AND name LIKE 'diag/%'"
        ).to_pylist()
    }
    turns = query(tmp_path, "SELECT count(*) AS n FROM turns WHERE iteration = 0 AND split = 'train'").to_pylist()
    # 'block' gives every reply a reasoning, so there are as many draws as turns, every draw its own prompt column
    assert stored["diag/reasoning_mt_trajectories"] == turns[0]["n"] == stored["diag/reasoning_mt_prompts"]
    assert stored["diag/reasoning_mt_mi_bound"] == pytest.approx(math.log(min(8, turns[0]["n"])))
    assert "diag/reasoning_mi_per_token" in stored and "diag/reasoning_mi" in stored
