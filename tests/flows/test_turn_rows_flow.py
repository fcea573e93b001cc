"""Per-turn training rows through the real ``train`` flow (in-process, a tiny config): ``rollout.training_rows: turn``
on windowed Sokoban. The update steps over the kept trajectories' turns (each its own row), reuses the stored
log-probs (the first step's forward on unchanged weights watches them match), and a run failed inside its second
update resumes to the same numbers and the same final policy, bit for bit.
"""

import math

import numpy as np
import pytest

from ragen_core.storage import DataLake, query

TURNS = {
    "model": {},
    "env": {
        "name": "sokoban",
        "val_envs": ["sokoban"],
        "max_turns": 3,
        "max_actions_per_turn": 1,
        "max_actions_per_traj": 3,
    },
    "rollout": {
        "env_groups": 2,
        "group_size": 2,
        "max_new_tokens": 8,
        "context_window_mode": "limited_multi_turn",
        "max_context_window": 2,
        "training_rows": "turn",
    },
    "algorithm": {"filter_ratio": 1.0},
    "actor": {"mini_batch_size": 4, "micro_batch_size": 2},
    "trainer": {"iterations": 2, "checkpoint_every": 10},
    "eval": {"every": 2, "instances": 2},
}


def _tree(base, model_dir):
    return {**base, "model": {"path": str(model_dir)}}


def _metrics(root, run_id):
    rows = query(root, f"SELECT iteration, name, value FROM metrics WHERE run_id = '{run_id}'").to_pylist()
    return {(r["iteration"], r["name"]): r["value"] for r in rows if not r["name"].startswith(("time/", "perf/"))}


def _rows(root, run_id):
    sql = (
        f"SELECT iteration, split, group_id, traj_index, input_ids, behavior_logprobs, total_reward "
        f"FROM trajectories WHERE run_id = '{run_id}' ORDER BY ALL"
    )
    return query(root, sql).to_pylist()


@pytest.fixture(scope="module")
def turn_runs(prefect_harness, tmp_path_factory, tiny_model_dir):
    """A whole turn-row run, and one failed inside the update of iteration 1, then resumed."""
    import ragen_core.training.updater as updater
    from flows.train import train

    root = tmp_path_factory.mktemp("turn_rows")
    train(_tree(TURNS, tiny_model_dir), data_root=str(root), run_id="whole")
    real = updater.starpo_update

    def failing(config, actor, critic, inputs, iteration):
        if iteration == 1:
            raise RuntimeError("injected failure inside the update")
        return real(config, actor, critic, inputs, iteration)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(updater, "starpo_update", failing)
        with pytest.raises(RuntimeError, match="injected"):
            train(_tree(TURNS, tiny_model_dir), data_root=str(root), run_id="resumed")
    train(_tree(TURNS, tiny_model_dir), data_root=str(root), run_id="resumed")
    entropy = {
        **TURNS,
        "rollout": {**TURNS["rollout"], "backend": "scripted", "temperature": 0.1},
        "trainer": {"iterations": 1},
        "env": {**TURNS["env"], "max_actions_per_turn": 2, "max_actions_per_traj": 6},  # 1 or 2 per reply
        "algorithm": {"filter": "top_k", "filter_ratio": 0.5, "filter_metric": "entropy", "filter_entropy": "full"},
    }
    train(_tree(entropy, tiny_model_dir), data_root=str(root), run_id="entropy")
    return root


def test_the_update_steps_over_the_kept_turns(turn_runs):
    metrics = _metrics(turn_runs, "whole")
    for iteration in (0, 1):
        sql = (
            "SELECT num_turns, loss_mask, total_reward, group_id FROM trajectories WHERE run_id = 'whole' "
            f"AND iteration = {iteration} AND split = 'train' AND kept"
        )
        kept = query(turn_runs, sql).to_pylist()
        turn_rows = sum(row["num_turns"] for row in kept)
        assert turn_rows > len(kept)  # multi-turn trajectories: more turn rows than trajectories
        assert metrics[(iteration, "actor/optimizer_steps")] == math.ceil(turn_rows / 4)  # mini-batches of turns
        assert metrics[(iteration, "actor/trained_tokens")] == sum(sum(row["loss_mask"]) for row in kept)
        assert metrics[(iteration, "actor/behavior_logprob_gap")] < 1e-4  # stored = re-scored, turn row by turn row
        # GRPO over turn rows, each trajectory once in its group's statistics: by hand from the stored scores
        tokens = np.array([sum(row["loss_mask"]) for row in kept], dtype=float)
        advantages = []
        for row in kept:
            scores = np.array([r["total_reward"] for r in kept if r["group_id"] == row["group_id"]])
            advantages.append((row["total_reward"] - scores.mean()) / (scores.std(ddof=1) + 1e-6))
        expected = float((np.array(advantages) * tokens).sum() / tokens.sum())
        assert metrics[(iteration, "actor/advantage_mean")] == pytest.approx(expected, abs=1e-5)


def test_a_turn_row_run_resumed_inside_an_update_ends_bit_for_bit_as_the_whole_run(turn_runs):
    assert _metrics(turn_runs, "resumed") == _metrics(turn_runs, "whole")
    assert _rows(turn_runs, "resumed") == _rows(turn_runs, "whole")  # the final validation: the same final policy
    manifest = DataLake(turn_runs).read_manifest("resumed")
    assert manifest.status == "completed" and manifest.resumes[-1]["replayed"] == [0]


def test_the_entropy_filter_over_turn_rows_averages_each_turns_mean(turn_runs, tiny_model_dir):
    """RAGEN-2's episode entropy in its turn-level modes: the mean over the episode's turn rows of each row's mean
    token entropy (the full distribution's at the temperature 0.1, under the start model: iteration 0 is before
    any update; a low temperature spreads the tiny model's entropies apart), then the group's mean
    over episodes; recomputed here with a plain forward per turn. The scripted replies of one or two actions differ
    in length, so this is not the token mean over the trajectory."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sql = (
        "SELECT group_id, input_ids, loss_mask, segment_lengths, filter_metric_value, kept FROM trajectories "
        "WHERE run_id = 'entropy' AND split = 'train' ORDER BY group_id, traj_index"
    )
    rows = query(turn_runs, sql).to_pylist()
    episodes: dict[int, list[float]] = {}
    token_means = []
    for row in rows:
        start, turn_means, tokens = 0, [], []
        for length in row["segment_lengths"]:
            ids, mask = row["input_ids"][start : start + length], row["loss_mask"][start : start + length]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double() / 0.1, dim=-1)
            entropy = -(logp.exp() * logp).sum(dim=-1)  # (T,) the distribution predicting token t + 1
            trained = [float(entropy[t - 1]) for t in range(1, length) if mask[t]]
            turn_means.append(float(np.mean(trained)))
            tokens += trained
            start += length
        episodes.setdefault(row["group_id"], []).append(float(np.mean(turn_means)))
        token_means.append(float(np.mean(tokens)))
    by_tokens: dict[int, list[float]] = {}
    for row, value in zip(rows, token_means, strict=True):
        by_tokens.setdefault(row["group_id"], []).append(value)
    for row in rows:  # the run's forward is in float32; the token mean over the trajectory is 10x that away
        assert row["filter_metric_value"] == pytest.approx(np.mean(episodes[row["group_id"]]), abs=1e-5)
    assert max(abs(row["filter_metric_value"] - np.mean(by_tokens[row["group_id"]])) for row in rows) > 1e-4
    best = max(episodes, key=lambda g: (np.mean(episodes[g]), -g))  # top_k 0.5 of 2 groups: the larger entropy
    assert {row["group_id"] for row in rows if row["kept"]} == {best}
