"""The input-reasoning mutual information (template-collapse diagnostic): the estimator against exact distributions
and hand-computed values, the causal-LM scorer against an unbatched forward, the collapse warning rule, and a tiny
training run that stores ``diag/reasoning_mi`` equal to an independent recomputation from the lake."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ragen_core.config import build_config
from ragen_core.monitor.diagnostics import (
    candidate_prompts,
    first_reply,
    first_turn_reasoning,
    model_scorer,
    reasoning_mi,
    reasoning_tokens,
)
from ragen_core.monitor.metrics import template_collapse_warning
from ragen_core.run.iteration import IterationState
from ragen_core.run.record import RunRecord
from ragen_core.run.session import RunSession
from ragen_core.run.stages import commit_iteration
from ragen_core.storage import DataLake, query
from schemas.manifest import RunManifest


def exact_scorer(table):
    """A scorer from a hand-written table log p(z | x); records what it was asked."""
    asked = []

    def score(pairs):
        asked.extend(pairs)
        return np.array([table(x, z) for x, z in pairs])

    score.asked = asked
    return score


def batch(num_prompts: int, group_size: int, reasoning):
    """Prompts (k, k+100) per group k, every group member's reasoning from ``reasoning(k, member)``."""
    prompts = [(k, k + 100) for k in range(num_prompts) for _ in range(group_size)]
    reasonings = [reasoning(k, m) for k in range(num_prompts) for m in range(group_size)]
    return prompts, reasonings


@pytest.mark.parametrize("max_prompts, width", [(8, 4), (4, 4), (3, 3), (2, 2)])
def test_reasoning_copied_from_the_input_gives_log_m(max_prompts, width):
    prompts, reasonings = batch(4, 2, lambda k, m: (k, k + 100))  # deterministic copy: p(z|x) = [z == x]
    score = exact_scorer(lambda x, z: 0.0 if z == x else -math.inf)
    estimate = reasoning_mi(prompts, reasonings, score, max_prompts=max_prompts, seed=1)
    assert estimate.mi == pytest.approx(math.log(width)) and estimate.bound == pytest.approx(math.log(width))
    assert estimate.logp_own == 0.0 and estimate.logp_cross == pytest.approx(-math.log(width))
    assert estimate.retrieval == 1.0 and estimate.mi_per_token == pytest.approx(math.log(width))
    assert (estimate.trajectories, estimate.prompts, estimate.pairs) == (8, 4, 8 * width)
    # the two members of a group copy the same text: pairs they share are scored once (all of them when every
    # prompt is a candidate; a subsample may draw different others for the two)
    assert 4 * width <= estimate.scored <= 8 * width and (width < 4 or estimate.scored == 16)
    assert len(score.asked) == estimate.scored == len(set(score.asked))


def test_one_template_for_every_input_gives_zero():
    prompts, reasonings = batch(5, 3, lambda k, m: (7, 7, 7 + m))  # diverse reasoning, independent of the input
    score = exact_scorer(lambda x, z: -0.5 * len(z) - (z[-1] - 6))
    estimate = reasoning_mi(prompts, reasonings, score, max_prompts=4, seed=3)
    assert estimate.mi == pytest.approx(0.0, abs=1e-12) and estimate.mi_per_token == pytest.approx(0.0, abs=1e-12)
    assert estimate.logp_own == pytest.approx(estimate.logp_cross)
    assert estimate.retrieval == pytest.approx(1 / 4)  # four tied prompts share the credit: chance level
    assert estimate.bound == pytest.approx(math.log(4)) and estimate.prompts == 5


def test_two_prompts_two_reasonings_by_hand():
    # p(z_a|x1) = .8, p(z_a|x2) = .2; p(z_b|x1) = .3, p(z_b|x2) = .6; z_a came from x1 (1 token), z_b from x2 (2)
    x1, x2, z_a, z_b = (1,), (2,), (10,), (20, 21)
    probs = {(x1, z_a): 0.8, (x2, z_a): 0.2, (x1, z_b): 0.3, (x2, z_b): 0.6}
    estimate = reasoning_mi([x1, x2], [z_a, z_b], exact_scorer(lambda x, z: math.log(probs[x, z])), max_prompts=2)
    # MI = 1/2 [log(.8 / .5) + log(.6 / .45)] = 1/2 [0.4700036 + 0.2876821]
    assert estimate.mi == pytest.approx(0.3788428, abs=1e-7)
    assert estimate.logp_own == pytest.approx(0.5 * (math.log(0.8) + math.log(0.6)))
    assert estimate.logp_cross == pytest.approx(0.5 * (math.log(0.5) + math.log(0.45)))
    # per token: z_b's log-probs are halved, i.e. probabilities sqrt(.3) and sqrt(.6)
    per_token_b = 0.5 * math.log(0.6) - math.log((math.sqrt(0.3) + math.sqrt(0.6)) / 2)
    assert estimate.mi_per_token == pytest.approx(0.5 * (math.log(0.8 / 0.5) + per_token_b))
    assert estimate.retrieval == 1.0 and estimate.pairs == 4


def test_candidates_hold_the_own_prompt_and_distinct_others_reproducibly():
    own = [0, 0, 1, 2, 3, 4, 5, 5]
    rows = candidate_prompts(own, 6, 4, seed=7)
    assert rows.shape == (8, 4) and list(rows[:, 0]) == own
    for row in rows:
        assert len(set(row)) == 4 and set(row) <= set(range(6))
    assert (rows == candidate_prompts(own, 6, 4, seed=7)).all()
    assert candidate_prompts([0, 1], 2, 8, seed=0).tolist() == [[0, 1], [1, 0]]
    with pytest.raises(ValueError, match="max_prompts must be >= 2"):
        candidate_prompts(own, 6, 1, seed=0)


def test_a_single_prompt_or_empty_reasonings_give_no_estimate():
    score = exact_scorer(lambda x, z: 0.0)
    assert reasoning_mi([(1,), (1,), (1,)], [(5,), (6,), (7,)], score) is None  # X constant: MI says nothing
    assert reasoning_mi([(1,), (2,)], [(5,), ()], score) is None  # the empty reasoning is left out
    assert score.asked == []
    estimate = reasoning_mi([(1,), (2,), (3,)], [(5,), (), (6,)], score)
    assert (estimate.trajectories, estimate.prompts) == (2, 2)


def test_first_reply_and_its_reasoning(tiny_policy):
    ids = [1, 2, 3, 10, 11, 4, 5, 12]
    assert first_reply(ids, [0, 0, 0, 1, 1, 0, 0, 1]) == ((1, 2, 3), (10, 11))
    assert first_reply(ids, [0] * 8) == (tuple(ids), ())
    assert first_reply([1, 2], [0, 1]) == ((1,), (2,))
    _, tokenizer = tiny_policy
    reply = tuple(tokenizer.encode("<think>I go left, then up.</think><answer>Left</answer><|im_end|>"))
    reasoning = reasoning_tokens(reply, tokenizer.decode)
    assert reply[: len(reasoning)] == reasoning and len(reasoning) < len(reply)
    text = tokenizer.decode(list(reasoning))  # the shortest prefix with the closing tag (whose token may hold a
    assert "</think>" in text and "Left" not in text  # character or two of what follows), not the answer
    assert "</think>" not in tokenizer.decode(list(reasoning[:-1]))
    assert reasoning_tokens(reply, None) == reply  # thinking off: the whole first reply
    no_tag = tuple(tokenizer.encode("<answer>Left</answer>"))
    assert reasoning_tokens(no_tag, tokenizer.decode) == no_tag
    prompts, reasonings = first_turn_reasoning([[7, 8, *reply]], [[0, 0] + [1] * len(reply)], tokenizer.decode)
    assert prompts == [(7, 8)] and reasonings == [reasoning]


def unbatched_logp(model, x, z) -> float:
    """log p(z | x) from one unpadded forward and an explicit sum of log-softmax entries."""
    ids = torch.tensor([list(x) + list(z)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[len(x) - 1 + t, token] for t, token in enumerate(z)))


def test_model_scorer_equals_unbatched_forwards(tiny_policy):
    model, tokenizer = tiny_policy
    pairs = [((5, 6, 7, 8, 9), (11, 12)), ((5, 6), (13, 14, 15, 16)), ((20, 21, 22), (23,))]
    scores = model_scorer(model, tokenizer.pad_token_id, batch_size=2)(pairs)  # padding inside a batch of two
    expected = [unbatched_logp(model, x, z) for x, z in pairs]
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)


class RepeatLast(torch.nn.Module):
    """A causal LM with a known distribution: the next token repeats the current one with p ~ 1 (``copy``), or is
    uniform whatever the input (``template``)."""

    def __init__(self, vocab: int, copy: bool) -> None:
        super().__init__()
        self.vocab, self.copy = vocab, copy
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the scorer a device

    def forward(self, input_ids, attention_mask=None, **_):
        logits = torch.zeros(*input_ids.shape, self.vocab) + self.anchor
        if self.copy:
            logits = logits + 60.0 * torch.nn.functional.one_hot(input_ids, self.vocab)
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize("copy, expected", [(True, math.log(6)), (False, 0.0)])
def test_the_scorer_on_a_module_with_known_distribution(copy, expected):
    prompts, reasonings = batch(6, 2, lambda k, m: (k + 100, k + 100, k + 100))  # x ends in k+100: copy continues it
    score = model_scorer(RepeatLast(128, copy), pad_id=0, batch_size=5)
    estimate = reasoning_mi(prompts, reasonings, score, max_prompts=6, seed=0)
    assert estimate.mi == pytest.approx(expected, abs=1e-6)


def test_template_collapse_rule():
    def history(*values):
        return [{"diag/reasoning_mi": v, "actor/entropy": 1.0} for v in values]

    rule = {"warmup": 2, "drop": 0.5, "patience": 2}
    warning = template_collapse_warning(history(1.0, 2.0, 0.9), {"diag/reasoning_mi": 0.8}, **rule)
    assert warning.metric == "diag/reasoning_mi" and warning.value == 0.8 and warning.threshold == 1.0  # 0.5 x 2.0
    assert "template collapse" in warning.message
    assert template_collapse_warning(history(1.0, 2.0, 0.9), {"diag/reasoning_mi": 1.5}, **rule) is None  # recovered
    assert template_collapse_warning(history(1.0, 2.0, 1.2), {"diag/reasoning_mi": 0.8}, **rule) is None  # once only
    assert template_collapse_warning(history(2.0), {"diag/reasoning_mi": 0.1}, **rule) is None  # warmup: 1 < 2 earlier
    assert template_collapse_warning(history(1.0, 2.0), {"diag/reasoning_mi": 0.9}, **{**rule, "patience": 1})
    assert template_collapse_warning(history(-1.0, -0.5, -3), {"diag/reasoning_mi": -4}, **rule) is None  # peak <= 0
    skipped = history(1.0, 2.0) + [{"actor/entropy": 1.0}] + history(0.9)  # an iteration without the metric
    assert template_collapse_warning(skipped, {"diag/reasoning_mi": 0.8}, **rule).threshold == 1.0
    assert template_collapse_warning(history(1.0, 2.0, 0.9), {"actor/entropy": 1.0}, **rule) is None


@pytest.mark.parametrize(
    "mi_metric, watched, other",
    [
        ("per_token", "diag/reasoning_mi_per_token", "diag/reasoning_mi"),  # the default: RAGEN-2's headline
        ("sequence", "diag/reasoning_mi", "diag/reasoning_mi_per_token"),
    ],
)
def test_commit_records_the_template_collapse_event(tmp_path, caplog, mi_metric, watched, other):
    overrides = ["monitor.warmup=1", "monitor.mi_drop=0.4", "monitor.mi_patience=2"]
    chosen = [] if mi_metric == "per_token" else [f"monitor.mi_metric={mi_metric}"]  # per_token: the default
    config = build_config(overrides=overrides + chosen)
    record = RunRecord(DataLake(tmp_path), "mi", RunManifest(run_id="mi", status="running"))
    session = RunSession(config, DataLake(tmp_path), "mi", policy=None, updater=None, record=record)
    for iteration, mi in enumerate([1.0, 1.1, 0.6, 0.5, 0.9]):  # thresholds 0.6 x 1.1 = 0.66 from iteration 2
        metrics = {watched: mi, other: 5.0 - iteration, "actor/entropy": 1.0}
        commit_iteration(session, iteration, IterationState(metrics))
    events = query(tmp_path, "SELECT iteration, kind, metric, value, threshold FROM events ORDER BY 1").to_pylist()
    assert [(e["iteration"], e["kind"], e["metric"], e["value"]) for e in events] == [
        (3, "early_warning", watched, 0.5)  # 0.6 and 0.5 both below 0.66: two iterations in a row; the other never
    ]
    assert events[0]["threshold"] == pytest.approx(0.66) and "template collapse" in caplog.text


def independent_mi(root: Path, model) -> tuple[float, int, int]:
    """MI of iteration 0's training trajectories recomputed from the lake with unbatched forwards over every
    distinct prompt (the run scores under all of them when trainer.mi_prompts >= their number)."""
    rows = query(root, "SELECT input_ids, loss_mask FROM trajectories WHERE iteration = 0 AND split = 'train'")
    items = []
    for row in rows.to_pylist():
        mask = row["loss_mask"]
        start = mask.index(1)
        end = mask.index(0, start) if 0 in mask[start:] else len(mask)
        items.append((tuple(row["input_ids"][:start]), tuple(row["input_ids"][start:end])))
    prompts = sorted({x for x, _ in items})
    values = []
    for x, z in items:
        logps = np.array([unbatched_logp(model, other, z) for other in prompts])
        mixture = np.log(np.mean(np.exp(logps - logps.max()))) + logps.max()
        values.append(unbatched_logp(model, x, z) - mixture)
    return float(np.mean(values)), len(prompts), len(items)


def test_a_tiny_training_run_stores_the_mi_metric(prefect_harness, tmp_path, tiny_model_dir, tiny_policy):
    from flows.train import train

    config = {
        "model": {"path": str(tiny_model_dir)},
        "env": {"name": "sokoban", "val_envs": ["sokoban"]},
        "rollout": {"env_groups": 3, "group_size": 2, "max_new_tokens": 6, "enable_think": False},
        "actor": {"mini_batch_size": 6, "micro_batch_size": 6},
        # thinking off: RAGEN-2's span has no reasoning to score, the earlier one takes the whole first reply
        "trainer": {"iterations": 1, "mi_diagnostic": True, "mi_prompts": 8, "mi_reasoning": "block"},
        "eval": {"every": 1, "instances": 2},
    }
    train(config, data_root=str(tmp_path), run_id="mi-run")
    stored = {
        (r["iteration"], r["name"]): r["value"]
        for r in query(
            tmp_path, "SELECT iteration, name, value FROM metrics WHERE name LIKE 'diag/%' OR name = 'time/diagnose'"
        ).to_pylist()
    }
    assert {iteration for iteration, _ in stored} == {0}  # the final evaluation runs no rollouts to score
    mi, prompts, trajectories = independent_mi(tmp_path, tiny_policy[0])  # iteration 0: the start weights
    assert prompts == 3 and trajectories == 6  # three distinct Sokoban rooms, two rollouts each
    assert stored[0, "diag/reasoning_mi"] == pytest.approx(mi, rel=1e-4, abs=1e-5)
    assert stored[0, "diag/reasoning_prompts"] == 3 and stored[0, "diag/reasoning_pairs"] == 6 * 3
    assert stored[0, "diag/reasoning_mi_bound"] == pytest.approx(math.log(3)) and stored[0, "time/diagnose"] > 0
