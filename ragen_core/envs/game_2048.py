"""2048 (RAGEN-2's ``game_2048``): slide the tiles of a 4x4 grid, merging equal neighbours, to build a large tile.

Rules and rewards follow RAGEN-2's env: actions ``Up``, ``Right``, ``Down``, ``Left``; a move slides every tile as far
as it goes and merges each pair of equal tiles that meet (a tile merges at most once per move, pairs nearest the wall
first); after a move that changes the grid a new tile appears on a uniformly chosen empty cell, 2 with probability
``two_prob`` (0.9) else 4; the game starts with two such tiles. The reward of a move is ``0.1 * log2(1 + m)`` where
``m`` is the sum of the tiles merged by it (0 without merges); a move that changes nothing is an invalid action with
reward 0 (RAGEN-2's log reward; ``use_log_reward=False`` gives the raw merge sum and -0.1 for such a move). The game
is over when no move changes the grid. The spawns come from a generator seeded by the env seed.

Success is ours: RAGEN-2 counts success only when the game is over with a 2048 tile on the board, which its own budget
of 700 actions cannot reach (a 2048 tile needs about 930 spawns). Here success means a tile of at least ``target``
(default 512) appears, which also ends the episode; see docs/environments.md for the expert's measured rates.

The expert is an expectimax search (:func:`_row_heuristic`: our code, with the terms and weights published for a
well-known open-source 2048 expectimax player): its move maximises the expected heuristic value over every possible
next spawn followed by the best reply to it, using move and heuristic tables over 16-bit rows of tile exponents.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import pairwise
from typing import Any

import numpy as np

from ragen_core.envs.base import MAX_ENV_STEPS, StepResult, TextEnv, bounded, register_env

ACTIONS = ("Up", "Right", "Down", "Left")  # RAGEN-2's order
SIZE = 4
DEFAULT_TARGET = 512
# The expert packs a board into 16 nibbles of tile exponents: 2**15 is the largest tile it can hold.
MAX_TARGET = 2**15


def slide_line(line: list[int]) -> tuple[list[int], int]:
    """A line (tile values, 0 = empty) slid toward index 0, and the sum of the tiles created by merges."""
    tiles = [v for v in line if v]
    merged, gained, i = [], 0, 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            merged.append(2 * tiles[i])
            gained += 2 * tiles[i]
            i += 2
        else:
            merged.append(tiles[i])
            i += 1
    return merged + [0] * (len(line) - len(merged)), gained


def _lines(action: str) -> list[list[int]]:
    """Cell indices of each line of a 4x4 grid, ordered from the wall the tiles slide toward."""
    rows = [[r * SIZE + c for c in range(SIZE)] for r in range(SIZE)]
    cols = [[r * SIZE + c for r in range(SIZE)] for c in range(SIZE)]
    return {"Left": rows, "Right": [row[::-1] for row in rows], "Up": cols, "Down": [col[::-1] for col in cols]}[
        action
    ]


def apply_move(grid: list[int], action: str) -> tuple[list[int], int]:
    """The grid after sliding toward ``action`` (no spawn), and the merge sum."""
    result, total = list(grid), 0
    for cells in _lines(action):
        slid, gained = slide_line([grid[i] for i in cells])
        total += gained
        for i, value in zip(cells, slid, strict=True):
            result[i] = value
    return result, total


# ---- expert: expectimax over exponent rows --------------------------------------------------------------------


def _row_heuristic(exponents: list[int]) -> float:
    """The score of one row (or column) of exponents: empty cells and equal neighbours are good; a line that is not
    monotone (tiles not growing toward one end) loses the larger of its two monotonicity violations, weighted by a
    power of the exponents so that misplaced big tiles cost most; large tiles away from merging cost a little."""
    empty = exponents.count(0)
    merges = sum(1 for a, b in pairwise(exponents) if a and a == b)
    powered = [e**4 for e in exponents]
    rising = sum(b - a for a, b in pairwise(powered) if b > a)
    falling = sum(a - b for a, b in pairwise(powered) if a > b)
    spread = sum(e**3.5 for e in exponents)
    return 200_000.0 + 270.0 * empty + 700.0 * merges - 47.0 * min(rising, falling) - 11.0 * spread


def _pack(exponents: list[int]) -> int:
    return (exponents[0] << 12) | (exponents[1] << 8) | (exponents[2] << 4) | exponents[3]


def _unpack(row: int) -> list[int]:
    return [(row >> 12) & 15, (row >> 8) & 15, (row >> 4) & 15, row & 15]


def _row_entries(row: int) -> tuple[int, int, float]:
    """A 16-bit row of exponents slid left, slid right, and its heuristic value."""
    exponents = _unpack(row)
    values = [1 << e if e else 0 for e in exponents]
    left, _ = slide_line(values)
    right, _ = slide_line(values[::-1])
    to_exponents = lambda line: [min(15, v.bit_length() - 1) if v else 0 for v in line]  # noqa: E731
    return _pack(to_exponents(left)), _pack(to_exponents(right[::-1])), _row_heuristic(exponents)


class _RowTable(dict):
    """One column of :func:`_row_entries`, filled on first use (a game meets a few thousand of the 65,536 rows)."""

    def __init__(self, column: int) -> None:
        super().__init__()
        self.column = column

    def __missing__(self, row: int) -> Any:
        value = _row_entries(row)[self.column]
        self[row] = value
        return value


@lru_cache(maxsize=1)
def _tables() -> tuple[_RowTable, _RowTable, _RowTable]:
    """Row tables for the search: slid left, slid right, heuristic value (memoised per row)."""
    return _RowTable(0), _RowTable(1), _RowTable(2)


# A board for the search is one 64-bit integer of 16 exponent nibbles, row 0 in the highest 16 bits and, within a row,
# column 0 in the highest nibble (the layout of _pack).
_CELL_SHIFTS = tuple(range(60, -1, -4))


def _transpose(board: int) -> int:
    """The board mirrored on its main diagonal, by masking and shifting nibble blocks (cells (r, c) <-> (c, r))."""
    a = board & 0xF0F00F0FF0F00F0F | (board & 0x0000F0F00000F0F0) << 12 | (board & 0x0F0F00000F0F0000) >> 12
    return a & 0xFF00FF0000FF00FF | (a & 0x00FF00FF00000000) >> 24 | (a & 0x00000000FF00FF00) << 24


def _slide_rows(board: int, table: dict[int, int]) -> int:
    return (
        table[board >> 48] << 48
        | table[board >> 32 & 0xFFFF] << 32
        | table[board >> 16 & 0xFFFF] << 16
        | table[board & 0xFFFF]
    )


def move_board(board: int, action: str) -> int:
    """The search board after sliding toward ``action`` (no spawn)."""
    left, right, _ = _tables()
    if action == "Left":
        return _slide_rows(board, left)
    if action == "Right":
        return _slide_rows(board, right)
    return _transpose(_slide_rows(_transpose(board), left if action == "Up" else right))


def to_board(grid: list[int]) -> int:
    """The search board of a grid of tile values (row-major)."""
    board = 0
    for value in grid:
        board = board << 4 | (min(15, value.bit_length() - 1) if value else 0)
    return board


def _evaluate(board: int) -> float:
    heuristic = _tables()[2]
    columns = _transpose(board)
    rows = heuristic[board >> 48] + heuristic[board >> 32 & 0xFFFF] + heuristic[board >> 16 & 0xFFFF]
    cols = heuristic[columns >> 48] + heuristic[columns >> 32 & 0xFFFF] + heuristic[columns >> 16 & 0xFFFF]
    return rows + cols + heuristic[board & 0xFFFF] + heuristic[columns & 0xFFFF]


_LOST = -1.0e7


class _Search:
    """One decision's expectimax, with a transposition table."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, int], float] = {}

    def chance(self, board: int, depth: int) -> float:
        """Expected value over the spawn (2 with probability 0.9, else 4 on a uniformly chosen empty cell)."""
        if depth == 0:
            return _evaluate(board)
        key = (board, depth)
        if key in self.cache:
            return self.cache[key]
        total, count = 0.0, 0
        for shift in _CELL_SHIFTS:
            if not board >> shift & 0xF:
                total += 0.9 * self.best(board | 1 << shift, depth)[1] + 0.1 * self.best(board | 2 << shift, depth)[1]
                count += 1
        value = total / count if count else _evaluate(board)
        self.cache[key] = value
        return value

    def best(self, board: int, depth: int) -> tuple[str | None, float]:
        """The move of highest expected value and that value (a lost value when no move changes the board)."""
        best_action, best_value = None, _LOST
        for action in ACTIONS:
            moved = move_board(board, action)
            if moved != board:
                value = self.chance(moved, depth - 1)
                if best_action is None or value > best_value:
                    best_action, best_value = action, value
        return best_action, best_value


def expert_move(grid: list[int], depth: int = 2) -> str | None:
    """The expectimax move for ``grid`` (tile values, row-major), or None when no move changes it. Depth 2 looks at
    the move, every spawn, the best reply and its heuristic value; depth 1 is greedy on the heuristic."""
    return _Search().best(to_board(grid), depth)[0]


class Game2048Env(TextEnv):
    """A seeded 2048 game on a 4x4 grid."""

    def __init__(
        self,
        target: int = DEFAULT_TARGET,
        two_prob: float = 0.9,
        use_log_reward: bool = True,
        max_steps: int | None = None,
        expert_depth: int = 2,
        name: str = "game_2048",
    ) -> None:
        if bounded("target", target, 4, MAX_TARGET) & (target - 1):
            raise ValueError(f"target must be a power of two of at least 4, got {target}")
        bounded("two_prob", two_prob, 0.0, 1.0, integer=False)
        if max_steps is not None:
            bounded("max_steps (or null for no limit)", max_steps, 1, MAX_ENV_STEPS)
        if expert_depth not in (1, 2):
            raise ValueError(f"expert_depth must be 1 (greedy) or 2 (move, spawn, move), got {expert_depth}")
        self.name, self.target, self.two_prob = name, target, two_prob
        self.use_log_reward, self.max_steps, self.expert_depth = use_log_reward, max_steps, expert_depth
        self.grid: list[int] = []
        self.score, self.steps = 0, 0
        self._rng: np.random.Generator | None = None
        self._moving: tuple[tuple[int, ...], list[str]] = ((), [])

    def _spawn(self) -> None:
        empties = [i for i, value in enumerate(self.grid) if value == 0]
        rng = self._require_rng()
        cell = empties[int(rng.integers(0, len(empties)))]
        self.grid[cell] = 2 if rng.random() < self.two_prob else 4

    def _require_rng(self) -> np.random.Generator:
        if self._rng is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self._rng

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._rng = np.random.default_rng(int(seed))
        self.grid, self.score, self.steps = [0] * (SIZE * SIZE), 0, 0
        self._spawn()
        self._spawn()
        return self.render(), {"success": False}

    def moving_actions(self) -> list[str]:
        """The actions that would change the grid, in RAGEN-2's order (remembered for the current grid)."""
        key = tuple(self.grid)
        if self._moving[0] != key:
            self._moving = (key, [a for a in ACTIONS if apply_move(self.grid, a)[0] != self.grid])
        return list(self._moving[1])

    @property
    def game_over(self) -> bool:
        return not self.moving_actions()

    def step(self, action: str) -> StepResult:
        self._require_rng()
        if self.success or self.game_over or (self.max_steps is not None and self.steps >= self.max_steps):
            raise RuntimeError("the 2048 episode is over; call reset(seed) first")
        self.steps += 1
        truncated = self.max_steps is not None and self.steps >= self.max_steps
        moved, merged = apply_move(self.grid, action) if action in ACTIONS else (self.grid, 0)
        if moved == self.grid:  # an unknown name, or a move that changes nothing
            reward = 0.0 if self.use_log_reward else -0.1
            info = {
                "success": False,
                "action_is_valid": False,
                "action_is_effective": False,
                "max_tile": max(self.grid),
            }
            return self.render(), reward, False, truncated, info
        self.grid = moved
        self.score += merged
        self._spawn()
        reward = (0.1 * math.log2(1 + merged) if merged else 0.0) if self.use_log_reward else float(merged)
        terminated = self.success or self.game_over
        info = {
            "success": self.success,
            "action_is_valid": True,
            "action_is_effective": True,
            "max_tile": max(self.grid),
        }
        return self.render(), reward, terminated, truncated and not terminated, info

    def render(self) -> str:
        self._require_rng()
        lines = [
            f"Row {r + 1}: [{', '.join(str(v) for v in self.grid[r * SIZE : (r + 1) * SIZE])}]" for r in range(SIZE)
        ]
        valid = self.moving_actions()
        lines.append(f"Valid actions: {', '.join(valid) if valid else 'None'}.")
        lines.append(f"Score: {self.score}")
        return "\n".join(lines)

    @property
    def action_names(self) -> list[str]:
        return list(ACTIONS)

    def instruction(self) -> str:
        return (
            "You are playing 2048 on a 4x4 grid (0 is an empty cell). Each action slides every tile Up, Right, Down "
            "or Left as far as it goes; two equal tiles that meet merge into one tile of their sum. After each move "
            "that changes the grid a new 2 (or sometimes 4) appears on an empty cell. A move that changes nothing is "
            f"invalid. Merges give reward 0.1 * log2(1 + merged sum). Reach a {self.target} tile to win; the game is "
            "lost when no move changes the grid."
        )

    @property
    def success(self) -> bool:
        return bool(self.grid) and max(self.grid) >= self.target

    def end_reason(self) -> str:
        """``"no_moves"`` when no move changes the grid any more (the game is lost), else ``"success"``."""
        return "success" if self.success else "no_moves"

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        """The merge sum of one move is at most the sum of the tiles, which starts at most 8 and grows by at most 4
        per move."""
        biggest_merge = 8 + 4 * max_actions
        if self.use_log_reward:
            return 0.0, max_actions * 0.1 * math.log2(1 + biggest_merge)
        return -0.1 * max_actions, float(max_actions * biggest_merge)

    def sample_action(self, rng: np.random.Generator) -> str:
        """A uniformly random action among those that change the grid (any action once the game is over)."""
        names = self.moving_actions() or list(ACTIONS)
        return names[int(rng.integers(0, len(names)))]

    def expert_plan(self, actions_left: int) -> list[str]:
        """One expectimax move (the spawn is random, so the expert re-plans after every move)."""
        move = expert_move(self.grid, self.expert_depth)
        return [move] if move is not None else []


@register_env("game_2048")
def make_game_2048(**overrides: Any) -> Game2048Env:
    """RAGEN-2's 2048 with our success target (a 512 tile by default)."""
    return Game2048Env(**{"name": "game_2048", **overrides})
