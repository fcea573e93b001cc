"""Per-turn training rows (``rollout.training_rows: turn``, RAGEN-2's samples in its context-window modes).

The rows are cut from the stored windowed rows and must be token-exact (what the sampler saw and produced at each
turn, and its log-probs as the trainer re-scores them); GRPO, the soft reweighting and the entropy filter over turn
rows are compared with small ports of RAGEN-2's code (``ragen/trainer/core_algos.py``
``compute_grpo_outcome_advantage`` with ``episode_ids``, ``ragen/trainer/agent_trainer.py``'s soft reweighting,
``ragen/trainer/rollout_filter.py``'s ``EntropyRolloutFilter``), written here with plain loops.
"""

from collections import defaultdict

import pyarrow as pa
import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.algos import grpo_advantage
from ragen_core.algos.reweighting import soft_advantage_weights
from ragen_core.config import ConfigError, build_config
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.records import BatchMeta, trajectories_table
from ragen_core.training.batch import collate, token_logprobs
from ragen_core.training.turn_rows import turn_entropy
from ragen_core.update.inputs import turn_update_inputs
from ragen_core.update.rows import TokenRows, turn_rows_of_table


def _rows(tokens: TokenRows) -> tuple[list[list[int]], list[list[int]]]:
    return [r.tolist() for r in tokens.id_rows()], [r.tolist() for r in tokens.mask_rows()]


def test_rows_are_cut_at_the_segment_lengths():
    rows, trajectory, turn = TokenRows.of(
        [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]],
        [[0, 1, 1, 0, 0, 1, 1], [0, 0, 1]],
        [[3, 4], [3]],
        [[0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0], [0.0, 0.0, -3.0]],
    ).turns()
    assert _rows(rows) == ([[1, 2, 3], [4, 5, 6, 7], [8, 9, 10]], [[0, 1, 1], [0, 0, 1, 1], [0, 0, 1]])
    assert trajectory.tolist() == [0, 0, 1] and turn.tolist() == [0, 1, 0]
    padded = rows.padded_logprobs(5)
    assert padded.tolist() == [[0, -0.5, -0.25, 0, 0], [0, 0, -1, -2, 0], [0, 0, -3, 0, 0]]
    assert TokenRows.of([[1, 2]], [[0, 1]], [[2]], [None]).turns()[0].logprobs is None  # a scripted row


def test_a_full_context_row_has_no_turn_rows_and_the_config_refuses_it():
    with pytest.raises(ValueError, match="row 1 is one full-context .*windowed rollout.context_window_mode"):
        TokenRows.of([[1, 2], [1, 2, 3]], [[0, 1], [0, 1, 1]], [[2], None]).turns()
    with pytest.raises(ConfigError, match="training_rows=turn"):
        build_config({"rollout": {"training_rows": "turn"}})
    windowed = {"context_window_mode": "single_turn", "max_context_window": 1, "training_rows": "turn"}
    with pytest.raises(ConfigError, match="reward_level=turn"):
        build_config({"rollout": windowed, "algorithm": {"reward_level": "turn"}})
    assert build_config({"rollout": windowed}).rollout.training_rows == "turn"


def ragen2_grpo(scores, index, episode_ids, norm_adv_by_std=True, epsilon=1e-6):
    """RAGEN-2's compute_grpo_outcome_advantage on sequence scores, its loops kept: (advantages, group std)."""
    id2score, seen = defaultdict(list), set()
    for i in range(len(scores)):
        if (index[i], episode_ids[i]) in seen:
            continue
        seen.add((index[i], episode_ids[i]))
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, values in id2score.items():
        if len(values) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(values)), torch.std(torch.stack(values))
    out = scores.clone()
    for i in range(len(scores)):
        centred = scores[i] - id2mean[index[i]]
        out[i] = centred / (id2std[index[i]] + epsilon) if norm_adv_by_std else centred
    return out, torch.stack([id2std[index[i]] for i in range(len(scores))])


def _turn_batch(seed):
    """Scores of turn rows: 3 groups, episodes of 1-4 turns (each row carries its episode's score), one group with a
    single episode; rows of an episode are not adjacent (as after a shuffle)."""
    generator = torch.Generator().manual_seed(seed)
    groups, episodes, scores = [], [], []
    for group, members in ((0, 4), (1, 3), (2, 1)):
        for member in range(members):
            episode = group * 10 + member
            score = float(torch.randint(0, 3, (1,), generator=generator)) - 0.1 * member
            turns = int(torch.randint(1, 5, (1,), generator=generator))
            groups += [group] * turns
            episodes += [episode] * turns
            scores += [score] * turns
    order = torch.randperm(len(scores), generator=generator)
    return (torch.tensor(scores)[order], torch.tensor(groups)[order], torch.tensor(episodes)[order])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_over_turn_rows_counts_each_episode_once_as_ragen2(seed, norm):
    scores, groups, episodes = _turn_batch(seed)
    mask = torch.ones(len(scores), 3)
    mask[:, 0] = 0
    rewards = torch.zeros(len(scores), 3)
    rewards[:, -1] = scores
    ours, _ = grpo_advantage(rewards, mask, groups, norm_adv_by_std=norm, episode_index=episodes)
    expected, _ = ragen2_grpo(scores, groups.tolist(), episodes.tolist(), norm)
    assert torch.allclose(ours[:, 1], expected, atol=1e-6)
    assert torch.equal(ours[:, 0], torch.zeros(len(scores)))
    plain, _ = grpo_advantage(rewards, mask, groups, norm_adv_by_std=norm)  # every row a member: other numbers
    assert not torch.allclose(plain[:, 1], expected, atol=1e-3)


def test_soft_reweighting_over_turn_rows_uses_the_episode_std_as_ragen2():
    scores, groups, episodes = _turn_batch(3)
    _, group_std = ragen2_grpo(scores, groups.tolist(), episodes.tolist())
    index = groups.numpy()
    prompt_std = {g: group_std[[i for i in range(len(index)) if index[i] == g][0]] for g in set(index.tolist())}
    largest = max(prompt_std.values())
    expected = torch.stack([prompt_std[g] / (largest + 1e-6) for g in index.tolist()])
    assert torch.allclose(soft_advantage_weights(scores, groups, episodes), expected, atol=1e-6)
    assert float(soft_advantage_weights(scores, groups, episodes).max()) == pytest.approx(1.0, abs=1e-5)


def ragen2_episode_entropy(entropys, loss_mask, episode_ids):
    """RAGEN-2's EntropyRolloutFilter with episode_ids: each row's masked mean, then the mean per episode."""
    per_row = (entropys * loss_mask).sum(dim=-1) / loss_mask.sum(dim=-1).clamp(min=1)
    order, rows = [], defaultdict(list)
    for i, episode in enumerate(episode_ids):
        if episode not in rows:
            order.append(episode)
        rows[episode].append(i)
    return torch.stack([per_row[rows[e]].mean() for e in order])


def _stored(*rows):
    """Stored trajectory rows with the columns the turn rows read: (ids, mask, segments, log-probs)."""
    names = ("input_ids", "loss_mask", "segment_lengths", "behavior_logprobs")
    columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    return pa.table({**columns, "behavior_source": ["policy"] * len(rows)})


def test_the_sampled_entropy_of_turn_rows_is_ragen2s_episode_mean():
    table = _stored(
        ([5, 6, 7, 8, 9], [0, 1, 1, 0, 1], [3, 2], [0.0, -1.0, -3.0, 0.0, -5.0]),
        ([5, 6, 7], [0, 0, 1], [3], [0.0, 0.0, -0.5]),
    )
    # by hand: trajectory 0's turns have mean -log p (1 + 3) / 2 = 2 and 5, so 3.5 (its token mean would be 3.0);
    # trajectory 1 has one turn, 0.5
    assert turn_entropy(table).tolist() == [3.5, 0.5]
    # RAGEN-2 over the same turn rows, the sampled -log p standing for its entropies
    entropys = torch.tensor([[0.0, 1.0, 3.0], [0.0, 5.0, 0.0], [0.0, 0.0, 0.5]])
    mask = torch.tensor([[0.0, 1, 1], [0, 1, 0], [0, 0, 1]])
    assert torch.allclose(ragen2_episode_entropy(entropys, mask, [0, 0, 1]).double(), turn_entropy(table))


def _rollouts(tiny_policy, mode, window):
    model, tokenizer = tiny_policy

    class Recording(HFBackend):
        prompts: list = []

        def generate(self, contexts, seed):
            generations = super().generate(contexts, seed)
            pairs = zip(contexts, generations, strict=True)
            self.prompts.append([(list(context.prompt_ids), reply.token_ids) for context, reply in pairs])
            return generations

    backend = Recording(model, tokenizer, 1.0, 12)
    backend.prompts = []
    spec = RolloutSpec(
        "sokoban",
        [5, 6],
        2,
        max_turns=3,
        max_actions_per_turn=1,
        max_actions_per_traj=6,
        context_window_mode=mode,
        max_context_window=window,
    )
    return run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=3), backend.prompts


@pytest.mark.parametrize(("mode", "window"), [("single_turn", 2), ("limited_multi_turn", 2)])
def test_turn_rows_are_what_the_policy_saw_and_sampled_and_rescore_to_the_stored_logprobs(tiny_policy, mode, window):
    model, tokenizer = tiny_policy
    records, calls = _rollouts(tiny_policy, mode, window)
    table = trajectories_table(records, BatchMeta.training("run", 0, 1.0, "hash"))
    inputs = turn_update_inputs(table, tokenizer.pad_token_id, 1.0)
    turns = turn_rows_of_table(table)
    ids, masks = _rows(turns.tokens)
    assert len(ids) == sum(len(r.turns) for r in records) == len(inputs.batch)
    for row, (trajectory, turn) in enumerate(zip(turns.trajectory.tolist(), turns.turn.tolist(), strict=True)):
        active = [i for i, r in enumerate(records) if len(r.turns) > turn]  # the backend call's rows at this turn
        prompt, reply = calls[turn][active.index(trajectory)]
        assert ids[row] == prompt + reply  # the window it was sampled in, then the sampled ids
        assert masks[row] == [0] * len(prompt) + [1] * len(reply)
        assert float(inputs.scores[row]) == pytest.approx(records[trajectory].total_reward)
        assert int(inputs.group_index[row]) == records[trajectory].group_id
        assert int(inputs.episode_index[row]) == trajectory
    with torch.no_grad():  # the trainer's own scoring of the turn rows
        logprobs, _ = token_logprobs(model.eval(), collate(ids, masks, tokenizer.pad_token_id))
    mask = inputs.batch.loss_mask.bool()
    assert inputs.batch.position_ids is None and mask.sum() == sum(sum(m) for m in masks)
    assert float((logprobs[mask] - inputs.behavior_logprobs[mask]).abs().max()) < 1e-4
