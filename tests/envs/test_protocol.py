"""Every registered environment: the shared protocol, determinism from the seed, and scripted rollouts."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.envs import make_env, registered_envs
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts

REFERENCE_ENVS = [
    "bandit",
    "bandit_test",
    "bandit_reversed",
    "sokoban",
    "sokoban_large",
    "sokoban_new_vocab",
    "sokoban_coord",
    "frozen_lake",
    "countdown",
    "sudoku",
    "sudoku_pr147_4x4",
    "sudoku_pr147_9x9",
    "game_2048",
    "rubikscube",
    "dataset",
]


# Envs that cannot be built without settings: the shipped example's (the dataset env reads a file of prompts).
ENV_OPTIONS = {
    "dataset": {
        "data_file": "examples/arithmetic/prompts.jsonl",
        "reward_fn": "examples.arithmetic.reward:score",
        "answer_column": "solution",
    },
}


def _make(name: str):
    return make_env(name, **ENV_OPTIONS.get(name, {}))


def _trajectory_digest(name: str, seeds: range) -> str:
    """Digest of the observations, rewards and flags of random play from each seed (actions drawn from the seed)."""
    env = _make(name)
    log = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed)
        log.append(obs)
        for _ in range(10):
            obs, reward, terminated, truncated, info = env.step(env.sample_action(rng))
            log.append([obs, round(reward, 6), terminated, truncated, info["success"], info["action_is_effective"]])
            if terminated or truncated:
                break
    return hashlib.sha256(json.dumps(log).encode()).hexdigest()


ALL_ENVS = registered_envs()  # every registered environment, a new one included without editing this file


def test_registry_holds_every_reference_environment():
    assert set(REFERENCE_ENVS) <= set(ALL_ENVS)


@pytest.mark.parametrize("name", ALL_ENVS)
def test_protocol(name):
    env = _make(name)
    obs, info = env.reset(5)
    assert isinstance(obs, str) and obs == env.render() and isinstance(info, dict)
    assert env.instruction() and not env.success
    rng = np.random.default_rng(0)
    action = env.sample_action(rng)
    assert env.parse_action(action.upper() if env.action_names else action) == action
    obs, reward, terminated, truncated, info = env.step(action)
    assert {"success", "action_is_valid", "action_is_effective"} <= set(info)
    assert info["action_is_valid"] is True
    low, high = env.reward_bounds(10)
    assert low <= reward <= high
    assert isinstance(terminated, bool) and isinstance(truncated, bool)


@pytest.mark.parametrize("name", ALL_ENVS)
def test_same_seed_same_instance_and_trajectory_in_process(name):
    assert _trajectory_digest(name, range(30)) == _trajectory_digest(name, range(30))
    assert _trajectory_digest(name, range(30)) != _trajectory_digest(name, range(30, 60))


@pytest.mark.process  # a process per environment
def test_same_seed_same_trajectory_across_processes():
    code = (
        "import json, sys; from tests.envs.test_protocol import _trajectory_digest, ALL_ENVS;"
        "print(json.dumps({n: _trajectory_digest(n, range(30)) for n in ALL_ENVS}))"
    )
    # a different hash seed in the child makes any use of Python's salted hash() show up
    env = {"PYTHONHASHSEED": "12345", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    child = json.loads(out.stdout)
    assert child == {n: _trajectory_digest(n, range(30)) for n in ALL_ENVS}


def _spec(name, seeds, turns=5, per_turn=5, budget=10, group_size=1):
    return RolloutSpec(name, list(seeds), group_size, turns, per_turn, budget)


def test_expert_rollouts_through_the_engine(tiny_policy):
    _, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    expert = ScriptedBackend("expert", tokenizer)
    for name in ("bandit", "countdown"):
        records = run_rollouts(_spec(name, range(40), turns=1, per_turn=1, budget=1), expert, formatter, seed=0)
        assert all(r.success for r in records), name
    records = run_rollouts(_spec("sokoban", range(100)), expert, formatter, seed=0)
    env = make_env("sokoban")
    within_budget = [env.reset(seed)[1]["optimal_steps"] <= 10 for seed in range(100)]
    assert [r.success for r in records] == within_budget
    for record in records:
        assert record.format_penalty == 0 and record.num_actions <= 10
        assert all(len(turn.actions) <= 5 for turn in record.turns)


def test_random_rollouts_respect_turn_and_trajectory_budgets(tiny_policy):
    _, tokenizer = tiny_policy
    backend = ScriptedBackend("random", tokenizer)
    for name in ("sokoban_large", "frozen_lake", "sokoban_new_vocab"):
        records = run_rollouts(
            _spec(name, range(6), turns=4, per_turn=3, budget=7, group_size=4), backend, ChatFormatter(tokenizer), 1
        )
        for record in records:
            assert record.num_actions <= 7 and len(record.turns) <= 4
            assert all(1 <= len(turn.actions) <= 3 for turn in record.turns)
            if name != "frozen_lake":
                # a Sokoban game ends only when solved, out of actions or out of turns
                assert record.success or record.num_actions == 7 or len(record.turns) == 4
        assert {r.env_seed for r in records[:4]} == {0}  # a group shares its seed
