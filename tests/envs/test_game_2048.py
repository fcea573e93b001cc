import math

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.game_2048 import ACTIONS, apply_move, move_board, slide_line, to_board


@pytest.mark.parametrize(
    ("line", "slid", "merged"),
    [
        ([2, 2, 2, 2], [4, 4, 0, 0], 8),  # each tile merges once per move
        ([2, 2, 4, 0], [4, 4, 0, 0], 4),  # a merged tile does not merge again in the same move
        ([4, 0, 4, 8], [8, 8, 0, 0], 8),
        ([2, 0, 0, 2], [4, 0, 0, 0], 4),
        ([0, 0, 0, 2], [2, 0, 0, 0], 0),
        ([2, 4, 8, 16], [2, 4, 8, 16], 0),
        ([8, 8, 4, 4], [16, 8, 0, 0], 24),
    ],
)
def test_slide_and_merge_by_hand(line, slid, merged):
    assert slide_line(line) == (slid, merged)


def test_directions_by_hand():
    grid = [2, 0, 0, 2, 0, 4, 0, 0, 2, 0, 0, 0, 0, 0, 0, 4]
    assert apply_move(grid, "Left") == ([4, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0], 4)
    assert apply_move(grid, "Right") == ([0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 4], 4)
    assert apply_move(grid, "Up") == ([4, 4, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0], 4)
    assert apply_move(grid, "Down") == ([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 4, 0, 4], 4)


def test_expert_move_tables_agree_with_the_env_rules():
    rng = np.random.default_rng(0)
    for _ in range(300):
        grid = [int(v) for v in np.where(rng.random(16) < 0.6, 2 ** rng.integers(1, 12, size=16), 0)]
        board = to_board(grid)
        # the 64-bit board holds the exponents row by row, first cell in the highest nibble
        assert [board >> (60 - 4 * i) & 15 for i in range(16)] == [v.bit_length() - 1 if v else 0 for v in grid]
        for action in ACTIONS:
            assert move_board(board, action) == to_board(apply_move(grid, action)[0])


def test_start_tiles_and_spawn_odds():
    env = make_env("game_2048")
    fours = tiles = 0
    for seed in range(3000):
        env.reset(seed)
        placed = [v for v in env.grid if v]
        assert len(placed) == 2 and set(placed) <= {2, 4}
        fours += placed.count(4)
        tiles += 2
    # binomial(6000, 0.1): sd 0.0039; tolerance 4 sd
    assert abs(fours / tiles - 0.1) < 0.016


def _set(env, grid):
    env.grid = list(grid)


def test_rewards_invalid_moves_and_game_over():
    env = make_env("game_2048")
    env.reset(0)
    _set(env, [2, 2, 4, 8] + [0] * 12)
    text, reward, terminated, _, info = env.step("Left")
    assert env.grid[:3] == [4, 4, 8] and reward == pytest.approx(0.1 * math.log2(1 + 4))
    assert info["action_is_valid"] and sum(1 for v in env.grid if v) == 4  # three tiles plus one spawn
    assert (
        text.startswith("Row 1: [4, 4, 8, ") and "\nValid actions: " in text and "Score: 4" in text and not terminated
    )
    # a move that changes nothing: invalid, reward 0 (RAGEN-2's log reward), no spawn
    _set(env, [2, 4, 8, 16] + [0] * 12)
    before = env.render()
    _, reward, terminated, _, info = env.step("Up")
    assert (reward, terminated, info["action_is_valid"], info["action_is_effective"]) == (0.0, False, False, False)
    assert env.render() == before
    raw = make_env("game_2048", use_log_reward=False)
    raw.reset(0)
    _set(raw, [2, 4, 8, 16] + [0] * 12)
    assert raw.step("Up")[1] == -0.1
    _set(raw, [8, 8, 0, 0] + [0] * 12)
    assert raw.step("Left")[1] == 16.0
    # the last move that fills the board without a merge left ends the game, unsolved
    for seed in range(50):  # find a spawn that leaves no move (a 4, or a 2 that cannot merge)
        env.reset(seed)
        _set(env, [2, 4, 2, 4, 4, 2, 4, 2, 2, 4, 2, 4, 0, 8, 16, 32])
        _, _, terminated, _, info = env.step("Left")
        if terminated:
            break
    assert terminated and env.game_over and not info["success"] and "Valid actions: None." in env.render()


def test_reaching_the_target_is_success_and_ends_the_game():
    env = make_env("game_2048", target=64)
    env.reset(0)
    _set(env, [32, 32, 0, 0] + [0] * 12)
    _, reward, terminated, truncated, info = env.step("Right")
    assert terminated and not truncated and info["success"] and env.success and info["max_tile"] == 64
    with pytest.raises(RuntimeError, match="over"):
        env.step("Left")
    with pytest.raises(ValueError, match="power of two"):
        make_env("game_2048", target=100)


def test_reward_bounds_hold_under_random_play():
    env = make_env("game_2048", max_steps=60)
    rng = np.random.default_rng(1)
    low, high = env.reward_bounds(60)
    per_move_high = high / 60
    for seed in range(20):
        env.reset(seed)
        total = 0.0
        for _ in range(60):
            _, reward, terminated, truncated, _ = env.step(env.sample_action(rng))
            assert 0.0 <= reward <= per_move_high
            total += reward
            if terminated or truncated:
                break
        assert low <= total <= high


def _expert_max_tile(env, seed) -> tuple[int, int]:
    env.reset(seed)
    while True:
        plan = env.expert_plan(10**6)
        if not plan:
            return max(env.grid), env.steps
        _, _, terminated, truncated, _ = env.step(plan[0])
        if terminated or truncated:
            return max(env.grid), env.steps


def test_expert_reaches_the_default_target_and_beats_random_play():
    env = make_env("game_2048")
    assert env.target == 512
    # 195 of seeds 0..199 reach 512 (docs/environments.md, `python -m benchmarks.expert_bench --envs game_2048`);
    # a few seeds keep this test short
    results = [_expert_max_tile(env, seed) for seed in range(3)]
    assert all(tile >= 512 and steps <= 700 for tile, steps in results), results
    rng = np.random.default_rng(0)
    random_tiles = []
    for seed in range(8):
        env.reset(seed)
        while not env.game_over and not env.success:
            env.step(env.sample_action(rng))
        random_tiles.append(max(env.grid))
    assert max(random_tiles) < env.target, random_tiles
