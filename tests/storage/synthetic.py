"""Hand-built lake contents for storage, CLI and docs tests.

Rows are written through the real lake API (``DataLake.write_rows``: contract check, staging, atomic publish; run
manifests; commit markers), and the Python objects are kept, so tests compute their expected numbers from them in
plain Python, independently of SQL.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ragen_core.storage import DataLake, evaluation_rows
from schemas.manifest import RunManifest
from schemas.tables import TRAJECTORIES

MOVES = ("Up", "Down", "Left", "Right")
SOKOBAN_PLANS = (("Up", "Up"), ("Left", "Up"), ("Right",), ("Down", "Left", "Up"))
PROMPT_TOKENS = 6


@dataclass
class Turn:
    think: str
    answer: str
    actions: list[str]
    reward: float
    penalty: float
    format_ok: bool
    response_tokens: int
    tool_calls: list[dict[str, Any]] | None = None  # a tool env's calls (the calculator runs)

    @property
    def response(self) -> str:
        return f"<think>{self.think}</think><answer>{self.answer}</answer>"


@dataclass
class Trajectory:
    run_id: str
    iteration: int
    split: str
    env: str
    group_id: int
    traj_index: int
    env_seed: int
    turns: list[Turn]
    success: bool
    group_reward_std: float | None = None
    kept: bool | None = None
    config_hash: str = "hash"
    token_seed: int = 0

    @property
    def key(self) -> tuple:
        return (self.run_id, self.iteration, self.split, self.env, self.group_id, self.traj_index)

    @property
    def env_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    @property
    def format_penalty(self) -> float:
        return sum(t.penalty for t in self.turns)

    @property
    def total_reward(self) -> float:
        return self.env_reward + self.format_penalty

    @property
    def response_length(self) -> int:
        return sum(t.response_tokens for t in self.turns)

    def row(self) -> dict[str, Any]:
        rng = np.random.default_rng(self.token_seed)
        length = PROMPT_TOKENS + self.response_length
        mask = [0] * PROMPT_TOKENS + [1] * self.response_length
        logprobs = [0.0 if m == 0 else -float(v) for m, v in zip(mask, rng.uniform(0.01, 3.0, length), strict=True)]
        return {
            "run_id": self.run_id,
            "iteration": self.iteration,
            "split": self.split,
            "env": self.env,
            "group_id": self.group_id,
            "traj_index": self.traj_index,
            "env_seed": self.env_seed,
            "num_turns": len(self.turns),
            "num_actions": sum(len(t.actions) for t in self.turns),
            "env_reward": self.env_reward,
            "format_penalty": self.format_penalty,
            "total_reward": self.total_reward,
            "success": self.success,
            "truncated": False,
            "response_length": self.response_length,
            "group_reward_std": self.group_reward_std,
            "kept": self.kept,
            "policy_version": self.iteration,
            "behavior_source": "policy",
            "temperature": 1.0 if self.split == "train" else 0.5,
            "config_hash": self.config_hash,
            "input_ids": [int(x) for x in rng.integers(0, 500, length)],
            "loss_mask": mask,
            "behavior_logprobs": logprobs,
        }

    def teacher(self, turn_index: int) -> list[str] | None:
        """The teacher's moves at a turn (grid envs only; bandit has no teacher): one or two moves from the seed."""
        if self.env == "bandit":
            return None
        first = (self.env_seed + turn_index) % 4
        moves = {MOVES[first], MOVES[(first + 1) % 4]} if (self.env_seed + turn_index) % 3 == 0 else {MOVES[first]}
        return [m for m in MOVES if m in moves]

    def turn_info(self, turn_index: int) -> dict[str, Any]:
        """The turn's info: the teacher-agreement diagnostic of the rollout engine, where there is a teacher."""
        teacher = self.teacher(turn_index)
        if teacher is None:
            return {}
        actions = self.turns[turn_index].actions
        return {
            "teacher_actions": teacher,
            "teacher_agree": bool(actions) and actions[0] in teacher,
            "teacher_chance": len(teacher) / len(MOVES),
        }

    def turn_rows(self) -> list[dict[str, Any]]:
        key = dict(zip(("run_id", "iteration", "split", "env", "group_id", "traj_index"), self.key, strict=True))
        return [
            {
                **key,
                "turn_index": i,
                "observation": f"state {self.env_seed} turn {i}",
                "response": t.response,
                "think": t.think,
                "answer": t.answer,
                "actions": t.actions,
                "valid": t.format_ok and bool(t.actions),
                "format_ok": t.format_ok,
                "reward": t.reward,
                "penalty": t.penalty,
                "done": i == len(self.turns) - 1,
                "truncated": False,
                "response_tokens": t.response_tokens,
                "info": json.dumps(self.turn_info(i), sort_keys=True),
                "tool_calls": t.tool_calls,
            }
            for i, t in enumerate(self.turns)
        ]


def _turns(rng: np.random.Generator, env: str, iteration: int, success: bool) -> list[Turn]:
    """Replies whose think texts get less diverse with the iteration (the Echo Trap signal); a solve executes a plan
    of ``SOKOBAN_PLANS`` (in one or two turns), a failure random moves, some replies break the format."""
    if env == "bandit":
        plan = [["Dragon" if success else "Phoenix"]]
    elif success:
        chosen = list(SOKOBAN_PLANS[int(rng.integers(len(SOKOBAN_PLANS)))])
        plan = [chosen[:1], chosen[1:]] if len(chosen) > 1 and rng.random() < 0.5 else [chosen]
    else:
        plan = [[str(m) for m in rng.choice(MOVES, int(rng.integers(1, 3)))] for _ in range(int(rng.integers(1, 4)))]
    turns = []
    for i, actions in enumerate(plan):
        think = f"idea {int(rng.integers(0, max(1, 4 - iteration)))}"
        tokens = int(rng.integers(3, 20))
        if not (success or rng.random() < 0.8):
            turns.append(Turn(think, "", [], 0.0, -0.1, False, tokens))
            continue
        if env == "bandit":
            reward = 1.0 if success else 0.1
        else:
            reward = -0.1 * len(actions) + (10.0 if success and i == len(plan) - 1 else 0.0)
        turns.append(Turn(think, " || ".join(actions), actions, reward, 0.0, True, tokens))
    if env == "calculator":
        for turn in turns:
            turn.tool_calls = _tool_calls(rng, turn.actions)
    return turns


TOOLS = ("calculate", "answer")


def _tool_calls(rng: np.random.Generator, actions: list[str]) -> list[dict[str, Any]]:
    """A tool env's calls for a turn of these actions: one call per action that ran (now and then raising), and a
    reply without actions one call that did not parse; the column's rules hold (schemas.suites.tool_calls_problem)."""
    if not actions:
        return [{"name": None, "arguments": "{", "result": "error: not JSON", "error": "bad_json", "duration_s": 0.0}]
    calls = []
    for action in actions:
        raised = bool(rng.random() < 0.3)
        calls.append(
            {
                "name": TOOLS[int(rng.integers(len(TOOLS)))],
                "arguments": json.dumps({"expression": action}),
                "result": "error: raised ValueError" if raised else "42",
                "error": "raised" if raised else None,
                "duration_s": float(rng.integers(1, 100)) / 1000,
            }
        )
    return calls


def _apply_filter(group: list[Trajectory]) -> float:
    std = statistics.pstdev([t.total_reward for t in group])
    for t in group:
        t.group_reward_std = std
    return std


def make_batch(
    rng: np.random.Generator,
    run_id: str,
    env: str,
    iteration: int,
    split: str,
    groups: int,
    group_size: int,
    success_rate: float,
    filter_ratio: float = 1.0,
) -> list[Trajectory]:
    """One batch: ``groups`` x ``group_size`` trajectories; train batches get the variance filter's decision
    (population std of total_reward per group; the ``ceil(ratio * groups)`` highest-std groups are kept)."""
    batch = []
    for g in range(groups):
        seed = int(rng.integers(0, 10**6))
        for k in range(group_size):
            success = bool(rng.random() < success_rate)
            batch.append(
                Trajectory(
                    run_id,
                    iteration,
                    split,
                    env,
                    g,
                    k,
                    seed,
                    _turns(rng, env, iteration, success),
                    success,
                    token_seed=int(rng.integers(0, 2**31)),
                )
            )
    if split == "train":
        by_group = [[t for t in batch if t.group_id == g] for g in range(groups)]
        stds = [_apply_filter(group) for group in by_group]
        keep = max(1, math.ceil(filter_ratio * groups))
        kept = set(sorted(range(groups), key=lambda g: (-stds[g], g))[:keep])
        for t in batch:
            t.kept = t.group_id in kept
    return batch


@dataclass
class SyntheticRun:
    run_id: str
    env: str
    config: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)


def make_run(
    seed: int, run_id: str, env: str, iterations: int, groups: int = 4, group_size: int = 4, filter_ratio: float = 1.0
) -> SyntheticRun:
    """A run: train batches at iterations 0..iterations-1, validation (3 instances x 2) at every iteration and after
    the last; success rises with the iteration."""
    rng = np.random.default_rng(seed)
    config = {"seed": seed, "env": {"name": env}, "algorithm": {"filter_ratio": filter_ratio}}
    run = SyntheticRun(run_id, env, config)
    for iteration in range(iterations + 1):
        rate = min(0.9, 0.2 + 0.25 * iteration)
        train = []
        if iteration < iterations:
            train = make_batch(rng, run_id, env, iteration, "train", groups, group_size, rate, filter_ratio)
        val = make_batch(rng, run_id, env, iteration, "val", 3, 2, rate)
        run.trajectories += train + val
        run.metrics[iteration] = {f"val/{env}/success": sum(t.success for t in val) / len(val), "time/update": 0.5}
        if train:
            run.metrics[iteration]["rollout/reward_mean"] = statistics.fmean(t.total_reward for t in train)
    return run


def write_run(
    lake: DataLake,
    run: SyntheticRun,
    status: str = "completed",
    commit: bool = True,
    created: str = "2025-01-01T00:00:00+00:00",
) -> None:
    """Write a run's rows, metrics, evaluations, manifest and (``commit``) commit markers through the lake API."""
    manifest = RunManifest(
        run_id=run.run_id,
        config=run.config,
        config_hash=f"h-{run.run_id}",
        seed=run.config["seed"],
        status=status,
        created_at=created,
        updated_at=created,
        pid=1,
        host="test",
    )
    lake.write_manifest(run.run_id, manifest)
    for iteration in sorted(run.metrics):
        batch = [t for t in run.trajectories if t.iteration == iteration]
        for split, stage in (("train", "rollout"), ("val", f"eval-{run.env}")):
            rows = [t for t in batch if t.split == split]
            if rows:
                lake.write_rows("trajectories", run.run_id, iteration, [t.row() for t in rows], stage=stage)
                turns = [r for t in rows for r in t.turn_rows()]
                lake.write_rows("turns", run.run_id, iteration, turns, stage=stage)
        metrics = [
            {"run_id": run.run_id, "iteration": iteration, "name": k, "value": v}
            for k, v in sorted(run.metrics[iteration].items())
        ]
        lake.write_rows("metrics", run.run_id, iteration, metrics, stage="commit")
        val = pa.Table.from_pylist([t.row() for t in batch if t.split == "val"], schema=TRAJECTORIES.arrow_schema)
        lake.write_rows("evaluations", run.run_id, iteration, evaluation_rows(val), stage="commit")
        if commit:
            lake.commit_iteration(run.run_id, iteration, {"metrics": len(metrics)})


def config_json(run: SyntheticRun) -> str:
    return json.dumps(run.config, sort_keys=True)
