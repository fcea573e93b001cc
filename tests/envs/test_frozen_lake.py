import math

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.frozen_lake import goal_reachable

HORIZON = 10
ACTION_DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
ORDER = ["Left", "Down", "Right", "Up"]


def test_render_symbols_and_map_rules():
    env = make_env("frozen_lake")
    for seed in range(200):
        text, _ = env.reset(seed)
        assert set(text) <= set("P_OG\n") and text.count("P") == 1 and text.count("G") == 1
        assert [len(line) for line in text.split("\n")] == [4, 4, 4, 4]
        assert goal_reachable(env.rows)


def test_frozen_share_is_p():
    env = make_env("frozen_lake")
    frozen = holes = 0
    for seed in range(2000):
        env.reset(seed)
        row_tiles = "".join(env.rows)
        frozen += row_tiles.count("F")
        holes += row_tiles.count("H")
    # maps are redrawn until the goal is reachable, which removes some hole-heavy maps: slightly above 0.8
    assert 0.80 <= frozen / (frozen + holes) <= 0.84


def test_distinct_maps_in_1000_seeds():
    env = make_env("frozen_lake")
    assert len({env.reset(seed)[0] for seed in range(1000)}) >= 950


def test_hole_and_goal_end_the_episode_with_their_symbols():
    env = make_env("frozen_lake", desc=["SFFF", "FHFF", "FFFF", "FFFG"], is_slippery=False)
    env.reset(0)
    text, reward, terminated, _, info = env.step("Right")
    assert text.split("\n")[0] == "_P__" and reward == 0 and not terminated and info["action_is_effective"]
    text, reward, terminated, _, info = env.step("Down")
    assert text.split("\n")[1] == "_X__" and terminated and reward == 0 and not info["success"]
    with pytest.raises(RuntimeError, match="over"):
        env.step("Up")
    env.reset(0)
    for action in ["Down", "Down", "Down", "Right", "Right", "Right"]:
        text, reward, terminated, _, info = env.step(action)
    assert text.split("\n")[3] == "___\u221a" and reward == 1.0 and terminated and info["success"]


def test_slip_outcomes_are_a_third_each_and_never_opposite():
    # the player starts in the middle of an all-frozen 5x5 lake, so every outcome is a visible one-cell move
    env = make_env("frozen_lake", desc=["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"])
    counts = {"intended": 0, "left_of": 0, "right_of": 0, "opposite": 0, "none": 0}
    trials = 6000
    for trial in range(trials):
        env.reset(trial)
        action = ORDER[trial % 4]
        env.step(action)
        move = (env.position[0] - 2, env.position[1] - 2)
        index = ORDER.index(action)
        if move == ACTION_DELTAS[action]:
            counts["intended"] += 1
        elif move == ACTION_DELTAS[ORDER[(index - 1) % 4]]:
            counts["left_of"] += 1
        elif move == ACTION_DELTAS[ORDER[(index + 1) % 4]]:
            counts["right_of"] += 1
        elif move == ACTION_DELTAS[ORDER[(index + 2) % 4]]:
            counts["opposite"] += 1
        else:
            counts["none"] += 1
    # each share is binomial(6000, 1/3): sd 0.0061; tolerance 0.025 is 4 sd
    for key in ("intended", "left_of", "right_of"):
        assert abs(counts[key] / trials - 1 / 3) < 0.025, counts
    assert counts["opposite"] == 0 and counts["none"] == 0


def _optimal_success(rows: list[str], horizon: int) -> float:
    """Independent value iteration from the map text and the slip rule (intended or perpendicular, 1/3 each)."""
    size_r, size_c = len(rows), len(rows[0])
    start = next((r, c) for r in range(size_r) for c in range(size_c) if rows[r][c] == "S")

    def move(r, c, action):
        dr, dc = ACTION_DELTAS[action]
        return min(max(r + dr, 0), size_r - 1), min(max(c + dc, 0), size_c - 1)

    value = {(r, c): float(rows[r][c] == "G") for r in range(size_r) for c in range(size_c)}
    for _ in range(horizon):
        new = {}
        for (r, c), v in value.items():
            if rows[r][c] in "GH":
                new[(r, c)] = v
                continue
            best = 0.0
            for i, action in enumerate(ORDER):
                outcomes = [ORDER[(i - 1) % 4], action, ORDER[(i + 1) % 4]]
                best = max(best, sum(value[move(r, c, o)] for o in outcomes) / 3)
            new[(r, c)] = best
        value = new
    return value[start]


def _play(env, seed, policy, rng) -> bool:
    env.reset(seed)
    for left in range(HORIZON, 0, -1):
        action = env.expert_plan(left)[0] if policy == "expert" else env.sample_action(rng)
        _, _, terminated, _, info = env.step(action)
        if terminated:
            return bool(info["success"])
    return False


def test_expert_matches_value_iteration_optimum_over_1000_maps():
    env = make_env("frozen_lake")
    optimum = []
    for seed in range(1000):
        env.reset(seed)
        optimum.append(_optimal_success(env.rows, HORIZON))
        table = env.success_table(HORIZON)
        assert table[HORIZON, int(env._lake.s)].max() == pytest.approx(optimum[-1])
    rng = np.random.default_rng(0)
    expert = np.mean([_play(env, seed, "expert", rng) for seed in range(1000)])
    random_rate = np.mean([_play(env, seed, "random", rng) for seed in range(1000)])
    mean = float(np.mean(optimum))
    # successes are a sum of independent Bernoulli(p_i): 99% interval of the rate
    half_width = 2.576 * math.sqrt(sum(p * (1 - p) for p in optimum)) / 1000
    assert abs(expert - mean) <= half_width, (expert, mean, half_width)
    assert random_rate < expert - 0.2
    print(f"frozen_lake: optimum {mean:.3f}, expert {expert:.3f} (+-{half_width:.3f}), random {random_rate:.3f}")


def _goal_from_render(text: str) -> str:
    # independently of the env's fields: find P and G in the rendered grid and compare their coordinates
    grid = text.split("\n")
    (pr, pc), (gr, gc) = ((next((r, line.index(ch)) for r, line in enumerate(grid) if ch in line)) for ch in "PG")
    vertical = {True: "down", False: "up"}[gr > pr] if gr != pr else None
    horizontal = {True: "right", False: "left"}[gc > pc] if gc != pc else None
    return "The goal is " + " and ".join(word for word in (vertical, horizontal) if word) + "."


def test_describe_names_the_goal_direction_seen_in_the_rendered_grid():
    env = make_env("frozen_lake")
    rng = np.random.default_rng(0)
    for seed in range(200):
        rendered, _ = env.reset(seed)
        assert env.describe() == _goal_from_render(rendered)
        rendered, _, done, _, _ = env.step(ORDER[int(rng.integers(4))])  # after a (slippery) move too
        if not done:
            assert env.describe() == _goal_from_render(rendered)


def test_describe_by_hand():
    env = make_env("frozen_lake", desc=["SFFF", "FHFH", "FFFH", "HFFG"], is_slippery=False)
    env.reset(0)
    assert env.describe() == "The goal is down and right."
    env.step("Right"), env.step("Right"), env.step("Right")
    assert env.describe() == "The goal is down."
    env = make_env("frozen_lake", desc=["GF", "FS"], is_slippery=False)
    env.reset(0)
    assert env.describe() == "The goal is up and left."
    env.step("Up")
    assert env.describe() == "The goal is left."
    env.step("Left")
    assert env.describe() == "The goal is here."
    assert env.brief() == "Reach G, avoid O."
