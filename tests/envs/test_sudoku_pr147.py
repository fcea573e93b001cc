"""RAGEN-2's superseded Sudoku (its PR #147): ``sudoku_pr147_4x4`` and ``sudoku_pr147_9x9``."""

import time

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.sudoku_pr147 import CLUES, generate_puzzle


def _valid_solution(grid: list[int], size: int) -> bool:
    """Every row, column and box holds 1..size once (checked directly, not with the env's code)."""
    box = int(size**0.5)
    rows = [grid[r * size : (r + 1) * size] for r in range(size)]
    cols = [[grid[r * size + c] for r in range(size)] for c in range(size)]
    boxes = [
        [grid[(br + r) * size + bc + c] for r in range(box) for c in range(box)]
        for br in range(0, size, box)
        for bc in range(0, size, box)
    ]
    return all(sorted(unit) == list(range(1, size + 1)) for unit in rows + cols + boxes)


def _brute_count(grid: list[int], size: int, limit: int = 2) -> int:
    """Solutions of ``grid`` by plain row-major backtracking (independent of the env's bit-mask solver)."""
    box = int(size**0.5)
    grid = list(grid)

    def ok(i: int, v: int) -> bool:
        r, c = divmod(i, size)
        br, bc = r // box * box, c // box * box
        for k in range(size):
            if grid[r * size + k] == v or grid[k * size + c] == v:
                return False
        return all(grid[(br + a) * size + bc + b] != v for a in range(box) for b in range(box))

    def count(i: int) -> int:
        while i < size * size and grid[i]:
            i += 1
        if i == size * size:
            return 1
        total = 0
        for v in range(1, size + 1):
            if ok(i, v):
                grid[i] = v
                total += count(i + 1)
                grid[i] = 0
                if total >= limit:
                    break
        return total

    return count(0)


@pytest.mark.parametrize(("size", "difficulty", "seeds"), [(4, "easy", 200), (4, "hard", 200), (9, "easy", 15)])
def test_puzzles_have_one_solution_and_the_clue_count_of_their_difficulty(size, difficulty, seeds):
    for seed in range(seeds):
        puzzle = generate_puzzle(seed, size, difficulty)
        assert _valid_solution(list(puzzle.solution), size)
        assert all(p in (0, s) for p, s in zip(puzzle.puzzle, puzzle.solution, strict=True))
        assert sum(1 for v in puzzle.puzzle if v) == CLUES[size][difficulty]
        assert _brute_count(list(puzzle.puzzle), size) == 1


def test_distinct_puzzles_and_fast_9x9_generation():
    assert len({generate_puzzle(seed, 4).puzzle for seed in range(500)}) >= 450
    start = time.perf_counter()
    grids = {generate_puzzle(seed, 9, "easy").puzzle for seed in range(10_000, 10_020)}
    mean = (time.perf_counter() - start) / 20
    assert len(grids) == 20
    assert mean < 0.25, f"9x9 generation takes {mean * 1000:.0f} ms per puzzle (about 3 ms when the machine is idle)"


def test_actions_parse_in_ragens_formats():
    env = make_env("sudoku_pr147_4x4")
    env.reset(0)
    assert env.parse_action("2,3,4") == "2,3,4"
    assert env.parse_action(" 2 3 4 ") == "2,3,4"
    assert env.parse_action("place 4 at row 2 col 3") == "2,3,4"
    assert env.parse_action("Place 4 at Row 2, Col 3") == "2,3,4"
    for bad in ("5,1,1", "1,1,5", "0,1,1", "1,2", "up", "1,2,3,4", ""):
        assert env.parse_action(bad) is None, bad
    assert make_env("sudoku_pr147_9x9").parse_action("9,9,9") == "9,9,9"


def _cell(env, index):
    return f"{index // env.size + 1},{index % env.size + 1}"


def test_given_cells_clashes_overwrites_and_the_solving_move():
    env = make_env("sudoku_pr147_4x4")
    env.reset(7)
    puzzle, solution = env.instance.puzzle, env.instance.solution
    given = next(i for i, v in enumerate(puzzle) if v)
    before = env.render()
    _, reward, terminated, _, info = env.step(f"{_cell(env, given)},{solution[given]}")
    assert (reward, terminated, info["action_is_valid"], info["action_is_effective"]) == (0.0, False, False, False)
    assert env.render() == before
    # a value that already sits in the row of an empty cell is a clash: valid, ineffective, board unchanged
    empty = [i for i, v in enumerate(puzzle) if v == 0]
    row = empty[0] // 4
    clash = next(v for v in puzzle[row * 4 : row * 4 + 4] if v)
    _, reward, _, _, info = env.step(f"{_cell(env, empty[0])},{clash}")
    assert info["action_is_valid"] and not info["action_is_effective"] and env.render() == before
    # a wrong but clash-free value may be placed, and then overwritten
    wrong = [v for v in range(1, 5) if v != solution[empty[0]] and not env.conflicts(empty[0], v)]
    if wrong:
        env.step(f"{_cell(env, empty[0])},{wrong[0]}")
        assert env.board[empty[0]] == wrong[0]
    for index in empty[:-1]:
        _, reward, terminated, _, info = env.step(f"{_cell(env, index)},{solution[index]}")
        assert reward == 0.0 and not terminated and info["action_is_effective"]
    text, reward, terminated, truncated, info = env.step(f"{_cell(env, empty[-1])},{solution[empty[-1]]}")
    assert (reward, terminated, truncated, info["success"], env.success) == (1.0, True, False, True, True)
    assert "." not in text and [len(line.split()) for line in text.split("\n")] == [6, 6, 6, 6]
    with pytest.raises(RuntimeError, match="over"):
        env.step("1,1,1")


def test_truncated_after_max_steps():
    env = make_env("sudoku_pr147_4x4", max_steps=3)
    env.reset(1)
    flags = [env.step("9,9,9")[3] for _ in range(3)]
    assert flags == [False, False, True]
    with pytest.raises(RuntimeError, match="over"):
        env.step("1,1,1")


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="size must be 4 or 9"):
        make_env("sudoku_pr147_4x4", size=16)
    with pytest.raises(ValueError, match="difficulty"):
        make_env("sudoku_pr147_4x4", difficulty="extreme")


def _expert_solves(env, seed, budget) -> bool:
    env.reset(seed)
    while budget > 0 and not env.success:
        plan = env.expert_plan(budget)
        if not plan:
            return False
        for action in plan[:5]:
            _, _, terminated, truncated, _ = env.step(action)
            budget -= 1
            if terminated or truncated:
                return env.success
    return env.success


@pytest.mark.parametrize(
    ("name", "options", "seeds"),
    [("sudoku_pr147_4x4", {}, 200), ("sudoku_pr147_4x4", {"difficulty": "hard"}, 200), ("sudoku_pr147_9x9", {}, 100)],
)
def test_expert_solves_every_instance_within_the_step_limit(name, options, seeds):
    env = make_env(name, **options)
    assert all(_expert_solves(env, seed, env.max_steps) for seed in range(seeds))


def test_expert_recovers_after_wrong_placements():
    env = make_env("sudoku_pr147_4x4")
    rng = np.random.default_rng(0)
    recovered = 0
    for seed in range(50):
        env.reset(seed)
        for _ in range(4):
            env.step(env.sample_action(rng))
        budget = env.max_steps - env.steps
        while budget > 0 and not env.success and (plan := env.expert_plan(budget)):
            for action in plan:
                env.step(action)
                budget -= 1
        recovered += env.success
    # a wrong value can only block a cell whose solution value it holds elsewhere in the unit; overwriting it
    # unblocks the cell, so the expert finishes every board
    assert recovered == 50
