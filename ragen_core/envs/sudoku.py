"""Sudoku as RAGEN-2's HEAD has it (``ragen/env/sudoku/``, its PR #150, and the ``SimpleSudoku`` entry of its
``config/envs.yaml``): fill an N x N grid (9x9 by default, 4x4 as an option) so that every row, column and box
holds 1..N once. Our code, RAGEN-2's rules (docs/environments.md); the version it replaced (its PR #147: 4x4 by
default, a unique solution, reward 1 only when solved) is kept as ``sudoku_pr147_4x4`` / ``sudoku_pr147_9x9``
(:mod:`ragen_core.envs.sudoku_pr147`).

Generation: a random solved grid by backtracking (cells in row-major order, each cell's values tried in a fresh random
order), then 40% / 50% / 60% of the cells (easy / medium / hard) emptied, chosen at random; no uniqueness check, so a
puzzle may have other solutions, and any complete grid without a repeat counts as solved. One action places one
value (``place 5 at row 2 col 3``, ``2,3,5`` and RAGEN-2's other forms). Rewards per action: +1 for the generator's
value, +0.5 for another value that repeats nothing, -0.1 for an invalid action (an item that does not parse or lies
outside the board, a given cell, or a value already in the cell's row, column or box, the cell itself included), and
+10 more when the placement completes the grid, which ends the episode. The state is the bracketed grid (``[N]``
given, ``N`` placed, ``.`` empty) with the last action's feedback, the valid numbers of the last ten empty cells and
the progress (``render_format="with_feedback"``, as RAGEN-2's configured env).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from ragen_core.envs.base import MAX_ENV_STEPS, StepResult, TextEnv, bounded, bounded_reward, register_env

SIZES = (4, 9)  # RAGEN-2 also allows 16: its fill (ported below) took over 5 s on 3 of seeds 0..19 at 16x16
REMOVED_SHARE = {"easy": 0.4, "medium": 0.5, "hard": 0.6}  # share of the cells emptied, RAGEN-2's table
RENDER_FORMATS = ("simple", "detailed", "with_feedback")
EMPTY = "."
BANNER = "=" * 50
LEGEND = "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"
# RAGEN-2's action forms, tried in this order (re.search on the stripped, lower-cased item).
_PATTERNS = tuple(
    re.compile(pattern)
    for pattern in (
        r"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
        r"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
        r"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
        r"(\d+)\s+at\s+(\d+),\s*(\d+)",
        r"\((\d+),\s*(\d+),\s*(\d+)\)",
        r"(\d+),\s*(\d+),\s*(\d+)",
    )
)


@dataclass(frozen=True)
class SudokuPuzzle:
    """A puzzle (0 = empty) and the solved grid it was cut from, both row-major tuples of length N * N."""

    size: int
    puzzle: tuple[int, ...]
    solution: tuple[int, ...]


@cache
def _units(size: int) -> tuple[tuple[int, int, int], ...]:
    """(row, column, box) of every cell."""
    box = math.isqrt(size)
    return tuple((i // size, i % size, (i // size) // box * box + (i % size) // box) for i in range(size * size))


@cache
def _unit_cells(size: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]:
    """For every cell, the cells of its row, of its column and of its box (itself included in each)."""
    units = _units(size)
    members: list[dict[int, list[int]]] = [{}, {}, {}]
    for index, cell_units in enumerate(units):
        for kind, unit in enumerate(cell_units):
            members[kind].setdefault(unit, []).append(index)
    return tuple(tuple(tuple(members[kind][unit]) for kind, unit in enumerate(cell_units)) for cell_units in units)


@cache
def _all_units(size: int) -> tuple[tuple[int, ...], ...]:
    """The cells of every row, column and box."""
    return tuple(sorted({cells for per_cell in _unit_cells(size) for cells in per_cell}))


def _solved_grid(size: int, rng: np.random.Generator) -> list[int]:
    """A random solved grid, by RAGEN-2's method: depth-first over the cells in row-major order, trying each cell's
    values in a fresh random order (bit masks per row, column and box)."""
    units = _units(size)
    rows, cols, boxes = [0] * size, [0] * size, [0] * size
    cells = [0] * (size * size)

    def fill(index: int) -> bool:
        if index == len(cells):
            return True
        r, c, b = units[index]
        used = rows[r] | cols[c] | boxes[b]
        for value in rng.permutation(size):
            bit = 1 << int(value)
            if used & bit:
                continue
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            cells[index] = int(value) + 1
            if fill(index + 1):
                return True
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        cells[index] = 0
        return False

    fill(0)
    return cells


def complete(board: list[int], size: int) -> list[int] | None:
    """A solution that keeps every filled cell of ``board`` (0 = empty), or None: depth-first, always on the empty
    cell with the fewest candidates."""
    units, cells = _units(size), list(board)
    masks = [[0] * size for _ in range(3)]
    for index, value in enumerate(cells):
        for kind, unit in enumerate(units[index] if value else ()):
            if masks[kind][unit] & (1 << (value - 1)):
                return None  # the filled cells already repeat a value
            masks[kind][unit] |= 1 << (value - 1)

    def free(index: int) -> int:
        r, c, b = units[index]
        return ~(masks[0][r] | masks[1][c] | masks[2][b]) & ((1 << size) - 1)

    def search() -> bool:
        empty = [i for i, v in enumerate(cells) if not v]
        if not empty:
            return True
        index = min(empty, key=lambda i: bin(free(i)).count("1"))
        options = free(index)
        while options:
            bit = options & -options
            options ^= bit
            for kind, unit in enumerate(units[index]):
                masks[kind][unit] |= bit
            cells[index] = bit.bit_length()
            if search():
                return True
            for kind, unit in enumerate(units[index]):
                masks[kind][unit] ^= bit
        cells[index] = 0
        return False

    return cells if search() else None


@lru_cache(maxsize=4096)
def generate_puzzle(seed: int, size: int = 9, difficulty: str = "easy") -> SudokuPuzzle:
    """The puzzle of ``seed``: ``int(N * N * share)`` cells of a random solved grid emptied (no uniqueness check)."""
    rng = np.random.default_rng(seed)
    solution = _solved_grid(size, rng)
    puzzle = list(solution)
    for index in rng.permutation(size * size)[: int(size * size * REMOVED_SHARE[difficulty])]:
        puzzle[int(index)] = 0
    return SudokuPuzzle(size, tuple(puzzle), tuple(solution))


def parse_placement(text: str, size: int) -> tuple[int, int, int] | str:
    """``(row, col, value)`` (1-indexed) of one action item as RAGEN-2 reads it, else RAGEN-2's error message.

    As RAGEN-2's env does, the value comes first whenever ``place`` or ``at`` occurs anywhere in the item (so
    ``2,3,5`` is row 2, column 3, value 5, and ``5 at 2,3`` the same placement).
    """
    item = text.strip().lower()
    for pattern in _PATTERNS:
        match = pattern.search(item)
        if match is None:
            continue
        first, second, third = (int(group) for group in match.groups())
        value_first = "place" in item or "at" in item
        value, row, col = (first, second, third) if value_first else (third, first, second)
        for label, number in (("Row", row), ("Column", col), ("Number", value)):
            if not 1 <= number <= size:
                return f"{label} {number} is out of range (1-{size})"
        return row, col, value
    return f"Could not parse action: '{item}'. Expected format: 'place 5 at row 2 col 3' or '2,3,5'"


class SudokuEnv(TextEnv):
    """RAGEN-2's Sudoku (its HEAD): a seeded puzzle without a uniqueness check, dense placement rewards."""

    def __init__(
        self,
        size: int = 9,
        difficulty: str = "easy",
        max_steps: int = 81,
        render_format: str = "with_feedback",
        show_conflicts: bool = True,
        show_valid_numbers: bool = True,
        correct_placement_score: float = 1.0,
        invalid_action_score: float = -0.1,
        completion_bonus: float = 10.0,
        name: str = "sudoku",
    ) -> None:
        if size not in SIZES:
            raise ValueError(f"size must be 4 or 9 (16, which RAGEN-2 names, is too slow to fill), got {size}")
        if difficulty not in REMOVED_SHARE:
            raise ValueError(f"difficulty must be one of {sorted(REMOVED_SHARE)}, got {difficulty!r}")
        if render_format not in RENDER_FORMATS:
            raise ValueError(f"render_format must be one of {RENDER_FORMATS}, got {render_format!r}")
        bounded("max_steps", max_steps, 1, MAX_ENV_STEPS)
        scores = {
            "correct_placement_score": correct_placement_score,
            "invalid_action_score": invalid_action_score,
            "completion_bonus": completion_bonus,
        }
        for option, value in scores.items():
            bounded_reward(option, value)
        self.name, self.size, self.difficulty, self.max_steps = name, size, difficulty, max_steps
        self.render_format, self.show_conflicts = render_format, show_conflicts
        self.show_valid_numbers = show_valid_numbers
        self.correct_score, self.invalid_score = correct_placement_score, invalid_action_score
        self.bonus = completion_bonus
        self.instance: SudokuPuzzle | None = None
        self.board: list[int] = []
        self.steps = 0
        self.feedback = ""

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.instance = generate_puzzle(int(seed), self.size, self.difficulty)
        self.board, self.steps, self.feedback = list(self.instance.puzzle), 0, ""
        return self.render(), {"success": False, "empty_cells": self.board.count(0)}

    def load_puzzle(self, puzzle: SudokuPuzzle) -> str:
        """Start from a given puzzle instead of a generated one (hand-made boards); returns the rendered state."""
        if puzzle.size != self.size or len(puzzle.puzzle) != self.size**2 or len(puzzle.solution) != self.size**2:
            raise ValueError(f"the puzzle is {puzzle.size}x{puzzle.size}; this env is {self.size}x{self.size}")
        self.instance, self.board, self.steps, self.feedback = puzzle, list(puzzle.puzzle), 0, ""
        return self.render()

    def _require_instance(self) -> SudokuPuzzle:
        if self.instance is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self.instance

    def parse_action(self, text: str) -> str | None:
        """``row,col,value`` for a placement inside the board; any other non-empty item is passed on as it is (RAGEN-2
        hands every answer item to the env, which answers it with -0.1 and its error message); None when empty."""
        placement = parse_placement(text, self.size)
        if isinstance(placement, tuple):
            return "{},{},{}".format(*placement)
        return text.strip() or None

    def clashes(self, index: int, value: int) -> list[str]:
        """The units where ``value`` already stands (the cell itself included, as RAGEN-2 checks), in RAGEN-2's words:
        ``row R``, ``column C``, ``box (R,C)`` (1-indexed)."""
        row, col, box = _units(self.size)[index]
        board = self.board
        found = [any(board[other] == value for other in cells) for cells in _unit_cells(self.size)[index]]
        side = math.isqrt(self.size)
        names = [f"row {row + 1}", f"column {col + 1}", f"box ({box // side + 1},{box % side + 1})"]
        return [name for name, hit in zip(names, found, strict=True) if hit]

    def candidates(self, index: int) -> list[int]:
        """The values an empty cell can take without a repeat (empty list for a filled cell), as RAGEN-2 lists them."""
        if self.board[index]:
            return []
        return [value for value in range(1, self.size + 1) if not self.clashes(index, value)]

    def step(self, action: str) -> StepResult:
        instance = self._require_instance()
        if self.success or self.steps >= self.max_steps:
            raise RuntimeError("the Sudoku episode is over; call reset(seed) first")
        self.steps += 1
        truncated = self.steps >= self.max_steps
        placement = parse_placement(action, self.size)
        if isinstance(placement, str):
            return self._invalid(f"\u274c Invalid action format: {placement}", truncated)
        row, col, value = placement
        index = (row - 1) * self.size + (col - 1)
        if instance.puzzle[index]:
            return self._invalid(f"\u274c Cannot modify initial cell at ({row},{col})", truncated)
        clashes = self.clashes(index, value)
        if clashes:
            message = f"\u274c Invalid placement: {value} conflicts with {', '.join(clashes)}"
            valid = self.candidates(index)
            if valid:
                message += f"\n   Valid numbers for ({row},{col}): {valid}"
            return self._invalid(message, truncated)
        self.board[index] = value
        if value == instance.solution[index]:
            reward, self.feedback = self.correct_score, f"\u2713 Correct! Placed {value} at ({row},{col})"
        else:
            reward = self.correct_score * 0.5
            self.feedback = f"\u26a0 Placed {value} at ({row},{col}) - Valid but not optimal"
        solved = self.success
        if solved:
            reward += self.bonus
            self.feedback += "\n\U0001f389 Congratulations! Puzzle solved!"
        info = {"correct_placement": value == instance.solution[index]}
        return self._result(reward, solved, truncated and not solved, valid=True, **info)

    def _invalid(self, message: str, truncated: bool) -> StepResult:
        self.feedback = message
        return self._result(self.invalid_score, False, truncated, valid=False)

    def _result(self, reward: float, terminated: bool, truncated: bool, valid: bool, **extra: Any) -> StepResult:
        info = {"success": self.success, "action_is_valid": valid, "action_is_effective": valid, **extra}
        return self.render(), float(reward), terminated, truncated, info

    def conflict_cells(self) -> set[int]:
        """Filled cells whose value repeats in their row, column or box (none arise in play: a repeat is refused)."""
        board, found = self.board, set()
        for cells in _all_units(self.size):
            values = [board[i] for i in cells if board[i]]
            if len(set(values)) < len(values):
                found.update(i for i in cells if board[i] and values.count(board[i]) > 1)
        return found

    def grid_text(self, marked: bool) -> str:
        """RAGEN-2's grid: boxes split by ``|`` and dashed lines; ``marked`` gives its bracketed form (``[N]`` given,
        `` N `` placed, ``*N*`` repeated, `` . `` empty), else its simple one (values and ``.``)."""
        size, side = self.size, math.isqrt(self.size)
        conflicts = self.conflict_cells() if marked else set()
        lines = []
        for r in range(size):
            if r and r % side == 0:
                lines.append("-" * (size * (3 if marked else 2) + side - 1))
            text = ""
            for c in range(size):
                index, value = r * size + c, self.board[r * size + c]
                text += "| " if c and c % side == 0 else ""
                if not marked:
                    text += f"{value or EMPTY} "
                elif not value:
                    text += f" {EMPTY} "
                elif self._require_instance().puzzle[index]:
                    text += f"[{value}]"
                else:
                    text += f"*{value}*" if index in conflicts else f" {value} "
            lines.append(text.rstrip())
        return "\n".join(lines)

    def render(self) -> str:
        self._require_instance()
        if self.render_format == "simple":
            return self.grid_text(marked=False)
        lines = [BANNER, "SUDOKU PUZZLE", BANNER, self.grid_text(marked=True), "", LEGEND]
        if self.feedback:
            lines += ["", self.feedback]
        if self.render_format == "with_feedback":
            lines += self._feedback_sections()
        return "\n".join(lines)

    def _feedback_sections(self) -> list[str]:
        """RAGEN-2's ``with_feedback`` additions: repeated cells, the valid numbers of up to ten empty cells, the
        progress and the step count."""
        lines, size = [], self.size
        conflicts = sorted(self.conflict_cells()) if self.show_conflicts else []
        if conflicts:
            lines += ["", "\u26a0 CONFLICTS DETECTED:"]
            lines += [f"  - Cell ({i // size + 1},{i % size + 1}): {self.board[i]}" for i in conflicts]
        empty = [i for i, value in enumerate(self.board) if not value]
        if self.show_valid_numbers and 0 < len(empty) <= 10:
            lines += ["", "\U0001f4a1 VALID NUMBERS FOR EMPTY CELLS:"]
            for index in empty:
                valid = self.candidates(index)
                if valid:
                    lines.append(f"  - ({index // size + 1},{index % size + 1}): {valid}")
        filled = size * size - len(empty)
        given = sum(1 for value in self._require_instance().puzzle if value)
        lines += ["", f"Progress: {filled}/{size * size} cells filled ({given} initial, {filled - given} placed)"]
        lines.append(f"Steps: {self.steps}/{self.max_steps}")
        return lines

    @property
    def action_names(self) -> list[str]:
        return []  # free-form placements, read by parse_placement

    def instruction(self) -> str:
        side, example = math.isqrt(self.size), min(5, self.size)
        return (
            f"You are solving a Sudoku puzzle. Fill in the grid so that every row, column, and {side}x{side} box "
            f"contains the numbers 1-{self.size} without repetition.\n"
            "Initial cells are shown in [brackets] and cannot be modified. Empty cells are shown as dots (.).\n"
            f"Place numbers one at a time using the format: <answer>place {example} at row 2 col 3</answer> or "
            f"<answer>2,3,{example}</answer> (rows and columns counted from 1).\n"
            "The environment will provide feedback on valid/invalid moves and show conflicts if any occur."
        )

    def brief(self) -> str:
        return f"Fill the {self.size}x{self.size} Sudoku; answer row,col,value (from 1); [N] is fixed, . is empty."

    @property
    def success(self) -> bool:
        """RAGEN-2's ``is_solved``: every cell filled and nothing repeated (any solution counts)."""
        return self.instance is not None and 0 not in self.board and not self.conflict_cells()

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        steps = max(1, min(max_actions, self.max_steps))
        per_step = (self.correct_score, self.correct_score * 0.5, self.invalid_score)
        return steps * min(per_step) + min(0.0, self.bonus), steps * max(per_step) + max(0.0, self.bonus)

    def _placements(self) -> list[tuple[int, int]]:
        """Every valid (cell, value): a cell not given at the start, a value not yet in its row, column or box."""
        puzzle = self._require_instance().puzzle
        return [
            (index, value)
            for index in range(self.size * self.size)
            if not puzzle[index]
            for value in range(1, self.size + 1)
            if not self.clashes(index, value)
        ]

    def sample_action(self, rng: np.random.Generator) -> str:
        """A uniformly random valid placement (a random one on a cell not given at the start when none is valid)."""
        placements = self._placements()
        if placements:
            index, value = placements[int(rng.integers(0, len(placements)))]
        else:
            puzzle = self._require_instance().puzzle
            open_cells = [i for i, v in enumerate(puzzle) if not v]
            index, value = open_cells[int(rng.integers(0, len(open_cells)))], int(rng.integers(1, self.size + 1))
        return f"{index // self.size + 1},{index % self.size + 1},{value}"

    def expert_plan(self, actions_left: int) -> list[str]:
        """The generator's values: every cell that differs from the solved grid and can take its value now, in
        row-major order (+1 each, +10 with the last). Re-planned each turn: a cell blocked by a wrong value placed
        earlier follows once that value is overwritten; if wrong values only block each other, one of them is first
        overwritten with another value that repeats nothing. Where nothing of the solved grid can be placed, any
        solution that keeps the values placed so far (RAGEN-2 accepts every complete grid without a repeat); an empty
        plan when none of this exists (a cell cannot be emptied, so a wrongly filled row can be a dead end)."""
        instance = self._require_instance()
        plan, wrong = [], []
        for index, value in enumerate(instance.solution):
            if self.board[index] != value:
                if not self.clashes(index, value):
                    plan.append(f"{index // self.size + 1},{index % self.size + 1},{value}")
                elif self.board[index]:
                    wrong.append(index)
        if plan:
            return plan
        completion = complete(self.board, self.size)  # another solution that keeps every value placed so far
        if completion is not None:
            size = self.size
            return [f"{i // size + 1},{i % size + 1},{v}" for i, v in enumerate(completion) if not self.board[i]]
        for index in wrong:
            others = [v for v in range(1, self.size + 1) if not self.clashes(index, v)]
            if others:
                return [f"{index // self.size + 1},{index % self.size + 1},{others[0]}"]
        return []


@register_env("sudoku")
def make_sudoku(**overrides: Any) -> SudokuEnv:
    """RAGEN-2's SimpleSudoku (its HEAD): 9x9, easy (32 of 81 cells empty), 81 steps, rendered with feedback."""
    return SudokuEnv(**{"name": "sudoku", **overrides})
