"""The envs' teachers (``TextEnv.teacher_actions``): FrozenLake's safe-and-soonest moves and Sokoban's first moves of
every shortest solution, each checked against an independent search written here."""

from collections import deque

import pytest

from ragen_core.envs import make_env
from ragen_core.envs.sokoban_rooms import MOVES, solve, step_state

DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def _shortest_first_moves(rows: list[str], start: tuple[int, int], budget: int) -> set[str]:
    """Non-slippery FrozenLake: the first moves of every shortest hole-free path to G (by BFS from G), if one fits."""
    size = len(rows)
    goal = next((r, row.index("G")) for r, row in enumerate(rows) if "G" in row)
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DELTAS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in dist and rows[nr][nc] != "H":
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    if start not in dist or dist[start] > budget:
        return set()
    moves = set()
    for name, (dr, dc) in DELTAS.items():
        nxt = (min(max(start[0] + dr, 0), size - 1), min(max(start[1] + dc, 0), size - 1))
        if dist.get(nxt, 10**9) == dist[start] - 1:
            moves.add(name)
    return moves


def test_frozen_lake_teacher_walks_the_shortest_paths_without_slips():
    env = make_env("frozen_lake", is_slippery=False)
    checked = 0
    for seed in range(300):
        env.reset(seed)
        for budget in (10, 6, 3):
            expected = _shortest_first_moves(env.rows, env.position, budget)
            teacher = env.teacher_actions(budget)
            if expected:
                assert set(teacher) == expected, (seed, budget, env.rows)
                checked += 1
            else:  # the goal out of reach within the budget: no move is better, all tie
                assert teacher == env.action_names
    assert checked > 400


def test_frozen_lake_teacher_on_a_hand_made_map_is_not_the_left_wall():
    env = make_env("frozen_lake", is_slippery=False, desc=["SFFF", "FHFF", "FFFF", "FFFG"])
    env.reset(0)
    # with budget to spare every action still reaches G in time, so expert_plan ties and takes the first (Left);
    # the teacher takes a move of a 6-step path: Down or Right
    assert env.expert_plan(10) == ["Left"]
    assert env.teacher_actions(10) == ["Down", "Right"]
    env.step("Right")
    assert env.teacher_actions(9) == ["Right"]  # from (0,1) Down falls into the hole at (1,1)
    env.step("Right")
    assert env.teacher_actions(8) == ["Down", "Right"]  # (0,2): 4 steps either way


def test_frozen_lake_teacher_keeps_the_safest_moves_when_slippery():
    env = make_env("frozen_lake")
    for seed in range(200):
        env.reset(seed)
        table = env.success_table(10)[10, int(env._lake.s)]
        teacher = env.teacher_actions(10)
        best = table.max()
        for name in teacher:
            assert table[env.action_names.index(name)] == pytest.approx(best, abs=1e-9)


def test_sokoban_teacher_is_every_first_move_of_a_shortest_solution():
    env = make_env("sokoban")
    for seed in range(150):
        env.reset(seed)
        room, state = env._room(), env.state
        length = len(solve(room, state))
        expected = []
        for name, move in MOVES.items():
            successor = step_state(state, move, room.floor, room.width)
            if successor is not None and successor != state:
                rest = solve(room, successor)
                if rest is not None and len(rest) == length - 1:
                    expected.append(name)
        assert env.teacher_actions(10) == expected, seed


def test_sokoban_describe_names_where_the_box_and_target_lie():
    env = make_env("sokoban")
    env.reset(0)
    width = env.width
    (player, (box,)), target = env.state, env._room().targets[0]

    def direction(a: int, b: int) -> str:
        parts = []
        if b // width != a // width:
            parts.append("down" if b // width > a // width else "up")
        if b % width != a % width:
            parts.append("right" if b % width > a % width else "left")
        return " and ".join(parts)

    assert env.describe() == f"The box is {direction(player, box)}. The target is {direction(box, target)}."
    for action in solve(env._room(), env.state):
        env.step(action)
    assert env.describe() == "The boxes are on their targets."


def test_envs_without_a_teacher_say_so():
    bandit = make_env("bandit")
    bandit.reset(0)
    assert bandit.teacher_actions(1) is None
