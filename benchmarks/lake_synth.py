"""Vectorised synthetic batches for the lake benchmark: realistic Sokoban-like rows in the lake's schemas.

Each trajectory has ``turns`` turns; its ``input_ids`` are a prompt, then per turn a reply (trained tokens, with
log-probs) and an environment observation (masked out), as the rollout engine stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from schemas.tables import TRAJECTORIES, TURNS

PROMPT_TOKENS = 48
OBSERVATION_TOKENS = 12
MOVES = np.array(["Up", "Down", "Left", "Right"], dtype=object)


@dataclass(frozen=True)
class BatchShape:
    """Trajectories of one (run, iteration) batch: train groups x group size, then validation groups x k."""

    train_groups: int
    group_size: int
    val_groups: int
    val_k: int
    turns: int

    @property
    def trajectories(self) -> int:
        return self.train_groups * self.group_size + self.val_groups * self.val_k


def _grids(rng: np.random.Generator, count: int) -> np.ndarray:
    tiles = np.array(list("#_OXP"), dtype=object)
    grids = ["\n".join("".join(row) for row in rng.choice(tiles, (6, 6))) for _ in range(count)]
    return np.array(grids, dtype=object)


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _token_columns(rng: np.random.Generator, replies: np.ndarray) -> dict[str, pa.Array]:
    """``input_ids``, ``loss_mask``, ``behavior_logprobs`` for replies of shape (n, turns)."""
    n, turns = replies.shape
    segments = np.empty((n, 2 * turns), dtype=np.int64)  # prompt, reply 1, observation 1, reply 2, ...
    segments[:, 0] = PROMPT_TOKENS
    segments[:, 1::2] = replies
    segments[:, 2::2] = OBSERVATION_TOKENS
    is_reply = np.tile(np.arange(segments.shape[1]) % 2 == 1, n)
    mask = np.repeat(is_reply.astype(np.int8), segments.ravel())
    lengths = segments.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    logprobs = np.where(mask == 1, -rng.exponential(0.7, mask.size), 0.0).astype(np.float32)
    return {
        "input_ids": _lists(offsets, pa.array(rng.integers(0, 32000, mask.size, dtype=np.int32))),
        "loss_mask": _lists(offsets, pa.array(mask)),
        "behavior_logprobs": _lists(offsets, pa.array(logprobs)),
    }


def make_batch(
    rng: np.random.Generator, run_id: str, iteration: int, shape: BatchShape, grids: np.ndarray
) -> tuple[pa.Table, pa.Table]:
    """The ``trajectories`` and ``turns`` tables of one batch (filter decision included for train rows)."""
    n_train = shape.train_groups * shape.group_size
    n, turns = shape.trajectories, shape.turns
    split = np.where(np.arange(n) < n_train, "train", "val").astype(object)
    group_id = np.concatenate([np.arange(n_train) // shape.group_size, np.arange(n - n_train) // shape.val_k])
    traj_index = np.concatenate([np.arange(n_train) % shape.group_size, np.arange(n - n_train) % shape.val_k])
    replies = rng.integers(10, 40, (n, turns))
    actions_per_turn = rng.integers(0, 3, (n, turns))
    format_ok = rng.random((n, turns)) < 0.9
    actions_per_turn[~format_ok] = 0
    success = rng.random(n) < min(0.9, 0.1 + 0.02 * iteration)
    rewards = -0.1 * actions_per_turn + np.where(np.arange(turns) == turns - 1, 10.0, 0.0) * success[:, None]
    penalties = np.where(format_ok, 0.0, -0.1)
    total = rewards.sum(axis=1) + penalties.sum(axis=1)
    std = np.zeros(n)
    kept = np.full(n, None, dtype=object)
    by_group = total[:n_train].reshape(shape.train_groups, shape.group_size).std(axis=1)
    std[:n_train] = np.repeat(by_group, shape.group_size)
    keep = set(np.argsort(-by_group, kind="stable")[: max(1, shape.train_groups // 4)].tolist())
    kept[:n_train] = [int(g) in keep for g in group_id[:n_train]]
    trajectories = {
        "run_id": np.full(n, run_id, dtype=object),
        "iteration": np.full(n, iteration, np.int32),
        "split": split,
        "env": np.full(n, "sokoban", dtype=object),
        "group_id": group_id.astype(np.int32),
        "traj_index": traj_index.astype(np.int32),
        "env_seed": np.repeat(rng.integers(0, 2**40, n // 2 + 1), 2)[:n],
        "num_turns": np.full(n, turns, np.int32),
        "num_actions": actions_per_turn.sum(axis=1).astype(np.int32),
        "env_reward": rewards.sum(axis=1),
        "format_penalty": penalties.sum(axis=1),
        "total_reward": total,
        "success": success,
        "truncated": np.zeros(n, bool),
        "response_length": replies.sum(axis=1).astype(np.int32),
        "group_reward_std": pa.array(np.where(split == "train", std, np.nan), from_pandas=True),
        "kept": pa.array(kept, pa.bool_()),
        "policy_version": np.full(n, iteration, np.int32),
        "filter_metric_value": pa.array(np.where(split == "train", std, np.nan), from_pandas=True),  # ranked by std
        "segment_lengths": pa.nulls(n, pa.list_(pa.int32())),  # full context mode: one sequence per row
        "end_reason": np.where(success, "success", "turn_limit").astype(object),
        "final_state": np.full(n, "#####", dtype=object),
        "behavior_source": np.full(n, "policy", dtype=object),
        "temperature": np.where(split == "train", 1.0, 0.5).astype(np.float32),
        "config_hash": np.full(n, "bench", dtype=object),
        **_token_columns(rng, replies),
    }
    return pa.table(trajectories, schema=TRAJECTORIES.arrow_schema), _turns_table(
        rng, trajectories, actions_per_turn, format_ok, rewards, penalties, replies, grids, iteration
    )


def _turns_table(rng, traj, actions_per_turn, format_ok, rewards, penalties, replies, grids, iteration) -> pa.Table:
    n, turns = actions_per_turn.shape
    total = n * turns
    flat_actions = MOVES[rng.integers(0, 4, int(actions_per_turn.sum()))]
    offsets = np.concatenate([[0], np.cumsum(actions_per_turn.ravel())])
    thinks = np.array([f"plan {k}: push the box toward the target" for k in range(max(2, 40 - iteration))], object)
    think = thinks[rng.integers(0, len(thinks), total)]
    answers = np.array([" || ".join(flat_actions[offsets[i] : offsets[i + 1]]) for i in range(total)], object)
    responses = np.array([f"<think>{t}</think><answer>{a}</answer>" for t, a in zip(think, answers, strict=True)])
    repeat = np.repeat
    turn_index = np.tile(np.arange(turns, dtype=np.int32), n)
    columns = {
        "run_id": repeat(traj["run_id"], turns),
        "iteration": repeat(traj["iteration"], turns),
        "split": repeat(traj["split"], turns),
        "env": repeat(traj["env"], turns),
        "group_id": repeat(traj["group_id"], turns),
        "traj_index": repeat(traj["traj_index"], turns),
        "turn_index": turn_index,
        "observation": grids[rng.integers(0, len(grids), total)],
        "response": responses,
        "think": think,
        "answer": answers,
        "actions": _lists(offsets, pa.array(flat_actions, pa.string())),
        "valid": (format_ok & (actions_per_turn > 0)).ravel(),
        "format_ok": format_ok.ravel(),
        "reward": rewards.ravel(),
        "penalty": penalties.ravel(),
        "done": turn_index == turns - 1,
        "truncated": np.zeros(total, bool),
        "response_tokens": replies.ravel().astype(np.int32),
        "info": np.full(total, '{"action_is_effective": true}', dtype=object),
        "tool_calls": pa.nulls(total, TURNS.arrow_schema.field("tool_calls").type),  # a grid env calls no tool
    }
    return pa.table(columns, schema=TURNS.arrow_schema)


def grids(seed: int = 0, count: int = 256) -> np.ndarray:
    """A pool of Sokoban-like observations (6x6 text grids)."""
    return _grids(np.random.default_rng(seed), count)
