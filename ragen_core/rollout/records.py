"""Rollout records -> Arrow tables of the ``trajectories`` and ``turns`` schemas (rollout owns its records' rows:
storage, below it, stores tables and never imports rollout)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from ragen_core.rollout.types import TrajectoryRecord
from schemas import TRAJECTORIES, TURNS


@dataclass(frozen=True, kw_only=True)
class BatchMeta:
    """Row-level context of a rollout batch (keywords only: four of its fields are easily swapped by position)."""

    run_id: str
    iteration: int
    split: str
    policy_version: int
    temperature: float
    config_hash: str

    @classmethod
    def training(
        cls, run_id: str, iteration: int, temperature: float, config_hash: str, policy_version: int | None = None
    ) -> BatchMeta:
        """A training iteration's rollouts, sampled by the policy after ``policy_version`` updates (default
        ``iteration``: a synchronous run; an async run's batches are older, see
        :func:`ragen_core.run.stages.sampling_version`)."""
        version = iteration if policy_version is None else policy_version
        return cls(
            run_id=run_id,
            iteration=iteration,
            split="train",
            policy_version=version,
            temperature=temperature,
            config_hash=config_hash,
        )

    @classmethod
    def validation(cls, run_id: str, iteration: int, temperature: float, config_hash: str) -> BatchMeta:
        """Validation rollouts of the policy after ``iteration`` updates (``split='val'``)."""
        return cls(
            run_id=run_id,
            iteration=iteration,
            split="val",
            policy_version=iteration,
            temperature=temperature,
            config_hash=config_hash,
        )

    @classmethod
    def demonstrations(cls, run_id: str, config_hash: str) -> BatchMeta:
        """A bootstrap's scripted demonstrations: one batch, iteration 0, no policy behind them (version 0)."""
        return cls(
            run_id=run_id, iteration=0, split="train", policy_version=0, temperature=1.0, config_hash=config_hash
        )


def trajectories_table(records: list[TrajectoryRecord], meta: BatchMeta) -> pa.Table:
    """One row per trajectory; filter columns (``group_reward_std``, ``kept``, ``filter_metric_value``) start null."""
    columns = {
        "run_id": [meta.run_id] * len(records),
        "iteration": [meta.iteration] * len(records),
        "split": [meta.split] * len(records),
        "env": [r.env for r in records],
        "group_id": [r.group_id for r in records],
        "traj_index": [r.traj_index for r in records],
        "env_seed": [r.env_seed for r in records],
        "num_turns": [len(r.turns) for r in records],
        "num_actions": [r.num_actions for r in records],
        "env_reward": [r.env_reward for r in records],
        "format_penalty": [r.format_penalty for r in records],
        "total_reward": [r.total_reward for r in records],
        "success": [r.success for r in records],
        "truncated": [r.truncated for r in records],
        "response_length": [r.response_length for r in records],
        "group_reward_std": [None] * len(records),
        "kept": [None] * len(records),
        "policy_version": [meta.policy_version] * len(records),
        "behavior_source": [r.behavior_source for r in records],
        "temperature": [meta.temperature] * len(records),
        "config_hash": [meta.config_hash] * len(records),
        "input_ids": [r.input_ids for r in records],
        "loss_mask": [r.loss_mask for r in records],
        "behavior_logprobs": [r.behavior_logprobs for r in records],
        "filter_metric_value": [None] * len(records),
        "segment_lengths": [r.segment_lengths for r in records],
        "end_reason": [r.end_reason for r in records],
        "final_state": [r.final_state for r in records],
    }
    return pa.Table.from_pydict(columns, schema=TRAJECTORIES.arrow_schema)


def turns_table(records: list[TrajectoryRecord], meta: BatchMeta) -> pa.Table:
    """One row per turn of every trajectory."""
    rows = [(r, t) for r in records for t in r.turns]
    columns = {
        "run_id": [meta.run_id] * len(rows),
        "iteration": [meta.iteration] * len(rows),
        "split": [meta.split] * len(rows),
        "env": [r.env for r, _ in rows],
        "group_id": [r.group_id for r, _ in rows],
        "traj_index": [r.traj_index for r, _ in rows],
        "turn_index": [t.turn_index for _, t in rows],
        "observation": [t.observation for _, t in rows],
        "response": [t.response for _, t in rows],
        "think": [t.think for _, t in rows],
        "answer": [t.answer for _, t in rows],
        "actions": [t.actions for _, t in rows],
        "valid": [t.valid for _, t in rows],
        "format_ok": [t.format_ok for _, t in rows],
        "reward": [t.reward for _, t in rows],
        "penalty": [t.penalty for _, t in rows],
        "done": [t.done for _, t in rows],
        "truncated": [t.truncated for _, t in rows],
        "response_tokens": [t.response_tokens for _, t in rows],
        "info": [json.dumps(t.info, sort_keys=True) for _, t in rows],
        "tool_calls": [t.tool_calls for _, t in rows],
    }
    return pa.Table.from_pydict(columns, schema=TURNS.arrow_schema)
