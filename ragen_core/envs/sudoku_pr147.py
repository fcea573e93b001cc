"""Sudoku as RAGEN-2's first version had it (its PR #147, superseded at its HEAD by the env in
:mod:`ragen_core.envs.sudoku`): fill an N x N grid (N = 4 or 9) so that every row, column and box holds 1..N once.
Registered as ``sudoku_pr147_4x4`` (that version's default) and ``sudoku_pr147_9x9``; the tiny default model's
tokenizer corpus renders these two (ragen_core/policy/tiny.py).

Rules, symbols and rewards follow that version: the board shows digits and ``.`` for an empty cell; one action
places one value, written ``row,col,value`` (1-indexed; ``place V at row R col C`` and ``R C V`` are accepted too).
A placement on a given (initial) cell is an invalid action; a placement that repeats a value in its row, column or box
is a valid but ineffective action and leaves the board unchanged; a cell the player filled may be overwritten. The
reward is 1 when the board is complete and correct (which ends the episode), else 0. The episode is truncated after
``max_steps`` actions. Puzzles are generated from the seed as RAGEN-2 does: a solved grid from a shuffled base pattern
(bands, rows within bands, stacks, columns within stacks, digit labels), then clues removed in random order while a
counting solver confirms the solution stays unique, down to the clue count of the difficulty.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from ragen_core.envs.base import MAX_ENV_STEPS, StepResult, TextEnv, bounded, register_env

# Clues kept per difficulty (RAGEN-2's table); fewer clues = harder.
CLUES = {4: {"easy": 10, "medium": 9, "hard": 6}, 9: {"easy": 36, "medium": 30, "hard": 24}}
EMPTY = "."
_PLACE = re.compile(r"^place\s+(\d+)\s+at\s+row\s+(\d+)\s*,?\s*col(?:umn)?\s+(\d+)$")
_TRIPLE = re.compile(r"^\(?\s*(\d+)\s*[,\s]\s*(\d+)\s*[,\s]\s*(\d+)\s*\)?$")
_POPCOUNT = [bin(mask).count("1") for mask in range(1 << 9)]


@dataclass(frozen=True)
class SudokuPuzzle:
    """A puzzle (0 = empty) and its unique solution, both as row-major tuples of length N * N."""

    size: int
    puzzle: tuple[int, ...]
    solution: tuple[int, ...]


@cache
def _peers(size: int) -> tuple[tuple[int, int, int], ...]:
    box = math.isqrt(size)
    return tuple((i // size, i % size, (i // size) // box * box + (i % size) // box) for i in range(size * size))


def count_solutions(cells: list[int] | tuple[int, ...], size: int, limit: int = 2) -> int:
    """How many solutions the grid ``cells`` (row-major, 0 = empty) has, counting no further than ``limit``.

    Depth-first search over bit masks, always branching on the empty cell with the fewest candidates.
    """
    peers = _peers(size)
    full = (1 << size) - 1
    rows, cols, boxes = [0] * size, [0] * size, [0] * size
    empty = []
    for index, value in enumerate(cells):
        r, c, b = peers[index]
        if value:
            bit = 1 << (value - 1)
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return 0  # the givens already clash
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
        else:
            empty.append(index)
    found = 0

    def search(open_cells: list[int]) -> None:
        nonlocal found
        if not open_cells:
            found += 1
            return
        best, best_free, best_count = -1, 0, size + 1
        for position, index in enumerate(open_cells):
            r, c, b = peers[index]
            free = full & ~(rows[r] | cols[c] | boxes[b])
            count = _POPCOUNT[free]
            if count < best_count:
                best, best_free, best_count = position, free, count
                if count <= 1:
                    break
        if best_count == 0:
            return
        index = open_cells[best]
        rest = open_cells[:best] + open_cells[best + 1 :]
        r, c, b = peers[index]
        while best_free and found < limit:
            bit = best_free & -best_free
            best_free ^= bit
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            search(rest)
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit

    search(empty)
    return found


def _solved_grid(size: int, rng: np.random.Generator) -> list[int]:
    """A solved grid: the base pattern with shuffled bands, rows, stacks, columns and digit labels."""
    box = math.isqrt(size)
    base = [[(r * box + r // box + c) % size + 1 for c in range(size)] for r in range(size)]
    rows = [band * box + int(r) for band in rng.permutation(box) for r in rng.permutation(box)]
    cols = [stack * box + int(c) for stack in rng.permutation(box) for c in rng.permutation(box)]
    labels = [int(v) + 1 for v in rng.permutation(size)]
    return [labels[base[r][c] - 1] for r in rows for c in cols]


@lru_cache(maxsize=4096)
def generate_puzzle(seed: int, size: int = 4, difficulty: str = "easy") -> SudokuPuzzle:
    """The puzzle of ``seed``: clues removed from a seeded solved grid while the solution stays unique."""
    rng = np.random.default_rng(seed)
    solution = _solved_grid(size, rng)
    target = CLUES[size][difficulty]
    puzzle = list(solution)
    filled = size * size
    for index in rng.permutation(size * size):
        if filled <= target:
            break
        kept, puzzle[index] = puzzle[index], 0
        if count_solutions(puzzle, size) == 1:
            filled -= 1
        else:
            puzzle[index] = kept
    return SudokuPuzzle(size, tuple(puzzle), tuple(solution))


def parse_placement(text: str) -> tuple[int, int, int] | None:
    """``(row, col, value)`` (1-indexed) from ``r,c,v``, ``r c v`` or ``place v at row r col c``, else None."""
    item = text.strip().lower()
    match = _PLACE.match(item)
    if match:
        value, row, col = (int(g) for g in match.groups())
        return row, col, value
    match = _TRIPLE.match(item)
    if match:
        row, col, value = (int(g) for g in match.groups())
        return row, col, value
    return None


class SudokuPR147Env(TextEnv):
    """A seeded Sudoku with a unique solution; one action places one value."""

    def __init__(
        self, size: int = 4, difficulty: str = "easy", max_steps: int | None = None, name: str = "sudoku_pr147_4x4"
    ) -> None:
        if size not in CLUES:
            raise ValueError(f"size must be 4 or 9, got {size}")
        if difficulty not in CLUES[size]:
            raise ValueError(f"difficulty must be one of {sorted(CLUES[size])}, got {difficulty!r}")
        if max_steps is not None:
            bounded("max_steps", max_steps, 1, MAX_ENV_STEPS)
        self.name, self.size, self.difficulty = name, size, difficulty
        # RAGEN-2 caps a 4x4 game at 30 steps and a 9x9 one at 81.
        self.max_steps = max_steps if max_steps is not None else (30 if size == 4 else 81)
        self.instance: SudokuPuzzle | None = None
        self.board: list[int] = []
        self.steps = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.instance = generate_puzzle(int(seed), self.size, self.difficulty)
        self.board = list(self.instance.puzzle)
        self.steps = 0
        return self.render(), {"success": False, "clues": sum(1 for v in self.board if v)}

    def _require_instance(self) -> SudokuPuzzle:
        if self.instance is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self.instance

    def parse_action(self, text: str) -> str | None:
        """The canonical ``row,col,value`` if the item names a cell and value inside the board, else None."""
        placement = parse_placement(text)
        if placement is None or not all(1 <= part <= self.size for part in placement):
            return None
        return "{},{},{}".format(*placement)

    def conflicts(self, index: int, value: int) -> bool:
        """Whether ``value`` at cell ``index`` repeats a value in its row, column or box (the cell itself aside)."""
        row, col, box = _peers(self.size)[index]
        for other, (r, c, b) in enumerate(_peers(self.size)):
            if other != index and self.board[other] == value and (r == row or c == col or b == box):
                return True
        return False

    def step(self, action: str) -> StepResult:
        instance = self._require_instance()
        if self.success or self.steps >= self.max_steps:
            raise RuntimeError("the Sudoku episode is over; call reset(seed) first")
        self.steps += 1
        truncated = self.steps >= self.max_steps
        canonical = self.parse_action(action)
        if canonical is None:
            return self._result(0.0, False, truncated, valid=False, effective=False)
        row, col, value = (int(part) for part in canonical.split(","))
        index = (row - 1) * self.size + (col - 1)
        if instance.puzzle[index]:
            return self._result(0.0, False, truncated, valid=False, effective=False)
        if self.conflicts(index, value):
            return self._result(0.0, False, truncated, valid=True, effective=False)
        self.board[index] = value
        solved = self.success
        return self._result(1.0 if solved else 0.0, solved, truncated and not solved, valid=True, effective=True)

    def _result(self, reward: float, terminated: bool, truncated: bool, valid: bool, effective: bool) -> StepResult:
        info = {"success": self.success, "action_is_valid": valid, "action_is_effective": effective}
        return self.render(), reward, terminated, truncated, info

    def render(self) -> str:
        self._require_instance()
        rows = []
        for r in range(self.size):
            cells = self.board[r * self.size : (r + 1) * self.size]
            rows.append("| " + " ".join(str(v) if v else EMPTY for v in cells) + " |")
        return "\n".join(rows)

    @property
    def action_names(self) -> list[str]:
        return []  # free-form placements, checked by parse_action

    def instruction(self) -> str:
        box = math.isqrt(self.size)
        return (
            f"You are solving a {self.size}x{self.size} Sudoku. Fill the grid so that every row, every column and "
            f"every {box}x{box} box contains each number 1-{self.size} exactly once. Empty cells are shown as "
            f"{EMPTY}; the numbers given at the start cannot be changed. Place one number per action as "
            "row,col,value with rows and columns counted from 1, for example <answer>1,2,3</answer> puts 3 in "
            "row 1, column 2. A placement that repeats a number in its row, column or box is rejected. "
            "Solving the puzzle gives reward 1."
        )

    @property
    def success(self) -> bool:
        return self.instance is not None and self.board == list(self.instance.solution)

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, 1.0

    def success_from_reward(self, env_reward: float) -> bool | None:
        """The only reward is 1 for the solved board."""
        return env_reward > 0.5

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random value on a random cell that was empty at the start (it may break the rules)."""
        instance = self._require_instance()
        open_cells = [i for i, v in enumerate(instance.puzzle) if v == 0]
        index = open_cells[int(rng.integers(0, len(open_cells)))]
        value = int(rng.integers(1, self.size + 1))
        return f"{index // self.size + 1},{index % self.size + 1},{value}"

    def expert_plan(self, actions_left: int) -> list[str]:
        """The solver's placements: every cell that differs from the unique solution and can take its solution value
        now without a clash, in row-major order. Re-planned each turn: a cell blocked by a wrong value placed earlier
        follows once that value is overwritten; if wrong values only block each other, one of them is first
        overwritten with another clash-free value (or the plan is empty when none exists)."""
        instance = self._require_instance()
        plan, wrong = [], []
        for index, value in enumerate(instance.solution):
            if self.board[index] != value:
                if not self.conflicts(index, value):
                    plan.append(f"{index // self.size + 1},{index % self.size + 1},{value}")
                elif self.board[index]:
                    wrong.append(index)
        for index in wrong if not plan else []:
            others = [v for v in range(1, self.size + 1) if v != self.board[index] and not self.conflicts(index, v)]
            if others:
                return [f"{index // self.size + 1},{index % self.size + 1},{others[0]}"]
        return plan


@register_env("sudoku_pr147_4x4")
def make_sudoku_pr147_4x4(**overrides: Any) -> SudokuPR147Env:
    """RAGEN-2's PR #147 Sudoku at its default: 4x4, easy (10 clues), 30 steps (our ``sudoku`` before RAGEN-2's
    HEAD replaced this version)."""
    return SudokuPR147Env(**{"name": "sudoku_pr147_4x4", **overrides})


@register_env("sudoku_pr147_9x9")
def make_sudoku_pr147_9x9(**overrides: Any) -> SudokuPR147Env:
    """RAGEN-2's PR #147 Sudoku at 9x9: easy (36 clues), 81 steps (our ``sudoku_9x9`` before the rename)."""
    return SudokuPR147Env(**{"name": "sudoku_pr147_9x9", "size": 9, **overrides})
