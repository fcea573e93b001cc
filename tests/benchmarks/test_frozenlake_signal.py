"""The FrozenLake signal figures (benchmarks/frozenlake_signal.py) against hand-computed values on a one-move map
and against random episodes played through the env."""

import numpy as np
import pytest

from benchmarks.frozenlake_signal import map_signal, signal_table
from ragen_core.envs import make_env
from ragen_core.envs.frozen_lake import FrozenLakeEnv


@pytest.mark.parametrize(
    ("slippery", "q_values"),
    # Left, Down, Right, Up from S with G to its right. Without slips only Right reaches G. With slips each move
    # goes its way or to either side, a third each: Down, Right and Up each reach G a third of the time; Left never
    [(False, [0, 0, 1, 0]), (True, [0, 1 / 3, 1 / 3, 1 / 3])],
)
def test_one_move_map_by_hand(slippery, q_values):
    env = FrozenLakeEnv(desc=["SG", "FF"], is_slippery=slippery)
    env.reset(0)
    figures = map_signal(env, horizon=1)
    q = np.array(q_values)
    assert figures["success"] == pytest.approx(q.mean()) == pytest.approx(figures["reached"])
    assert figures["return_std"] == pytest.approx(np.sqrt(q.mean() * (1 - q.mean())))
    assert figures["best_advantage"] == pytest.approx(q.max() - q.mean())
    assert figures["mean_abs_advantage"] == pytest.approx(np.abs(q - q.mean()).mean())
    assert figures["decisions"] == pytest.approx(1.0)


def test_random_episodes_through_the_env_agree():
    env = make_env("frozen_lake")
    rng = np.random.default_rng(0)
    for seed in (3, 11):
        env.reset(seed)
        figures = map_signal(env, horizon=10)
        assert figures["reached"] == pytest.approx(figures["success"], abs=1e-12)
        wins, episodes, steps = 0, 1000, 0
        for episode in range(episodes):
            env.reset(seed)
            env._require_lake().reset(seed=episode)  # fresh slips each episode
            for _ in range(10):
                _, reward, done, _, _ = env.step(env.action_names[rng.integers(4)])
                steps += 1
                if done:
                    break
            wins += reward > 0
        se = np.sqrt(figures["success"] * (1 - figures["success"]) / episodes)
        assert abs(wins / episodes - figures["success"]) < 4 * se + 1e-9, (seed, wins / episodes, figures)
        assert steps / episodes == pytest.approx(figures["decisions"], rel=0.05)


def test_slips_shrink_the_signal_but_not_random_success():
    slippery, steady = signal_table(20, 10, True), signal_table(20, 10, False)
    # random moves under slips are still uniformly random moves: the same success
    assert slippery["success"] == pytest.approx(steady["success"])
    assert steady["best_advantage"] > 3 * slippery["best_advantage"]
    assert slippery["decisions_per_action"] == pytest.approx((2 / slippery["snr"]) ** 2)
