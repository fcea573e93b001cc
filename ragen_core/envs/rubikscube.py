"""Rubik's Cube 2x2 (RAGEN-2's pocket cube): restore a scrambled cube so that every face shows one color.

Rules, notation, symbols and rewards follow RAGEN-2's ``rubikscube`` env (except B and B', which RAGEN-2's sticker
table gets wrong: its B breaks a corner; ours is the legal back turn, docs/environments.md): 12 quarter turns in
Singmaster notation
(``U U' D D' L L' R R' F F' B B'``: a letter alone turns that face 90 degrees clockwise as seen looking at it, a prime
counter-clockwise); faces listed Up, Left, Front, Right, Back, Down with colors W (white), O (orange), G (green),
R (red), B (blue), Y (yellow); the cube starts solved and takes ``scramble_depth`` uniformly random quarter turns
from a generator seeded by the env seed. The reward is 1 when every face is one color (in any orientation of the whole
cube), which ends the episode; otherwise 0. The episode is truncated after ``max_steps`` actions.

The moves are derived from geometry (each sticker is a position and an outward normal on the cube, a move rotates the
stickers of one layer), not from a hand-written table. The expert is an optimal solver: it fixes the down-left-back
corner, recolors the state so that corner looks solved, and searches with U, R and F turns only (every state has an
optimal quarter-turn solution of this form) against a table of all states within 7 turns of solved.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ragen_core.envs.base import MAX_ENV_STEPS, StepResult, TextEnv, bounded, register_env

FACES = ("U", "L", "F", "R", "B", "D")
FACE_NAMES = {"U": "Up", "L": "Left", "F": "Front", "R": "Right", "B": "Back", "D": "Down"}
COLORS = ("W", "O", "G", "R", "B", "Y")  # the color of each face of the solved cube, in FACES order
ACTIONS = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")
MAX_SCRAMBLE_DEPTH = 1_000  # moves drawn for a scramble (20 reach every state of the cube)
OPPOSITE = {0: 5, 5: 0, 1: 3, 3: 1, 2: 4, 4: 2}  # face (= solved color) index -> the opposite one
SOLVED = tuple(face for face in range(6) for _ in range(4))
_NORMALS = {"U": (0, 1, 0), "D": (0, -1, 0), "F": (0, 0, 1), "B": (0, 0, -1), "L": (-1, 0, 0), "R": (1, 0, 0)}
TABLE_DEPTH = 7
Vec = tuple[int, int, int]


def _face_cells(face: str) -> list[Vec]:
    """The cubie positions of a face's four stickers in reading order (top-left, top-right, bottom-left,
    bottom-right) as seen looking at that face, with U seen from above (Front at the bottom) and D from below
    (Front at the top). Coordinates: x to the right, y up, z to the front."""
    rows_cols = {
        "U": lambda r, c: (c, 1, r),
        "D": lambda r, c: (c, -1, -r),
        "F": lambda r, c: (c, -r, 1),
        "B": lambda r, c: (-c, -r, -1),
        "L": lambda r, c: (-1, -r, c),
        "R": lambda r, c: (1, -r, -c),
    }[face]
    return [rows_cols(r, c) for r in (-1, 1) for c in (-1, 1)]


@lru_cache(maxsize=1)
def _stickers() -> dict[tuple[Vec, Vec], int]:
    """Sticker index (face * 4 + reading position) by (cubie position, outward normal)."""
    return {
        (cell, _NORMALS[face]): f * 4 + k for f, face in enumerate(FACES) for k, cell in enumerate(_face_cells(face))
    }


def _rotate_clockwise(vector: Vec, axis: Vec) -> Vec:
    """``vector`` turned 90 degrees clockwise as seen looking along ``-axis`` (from outside the face):
    v' = n (n . v) - n x v for a unit axis n."""
    (x, y, z), (a, b, c) = vector, axis
    dot = a * x + b * y + c * z
    cross = (b * z - c * y, c * x - a * z, a * y - b * x)
    return (a * dot - cross[0], b * dot - cross[1], c * dot - cross[2])


@lru_cache(maxsize=1)
def move_permutations() -> dict[str, tuple[int, ...]]:
    """For each action, ``perm`` such that the state after the move is ``tuple(state[i] for i in perm)``."""
    stickers = _stickers()
    quarter: dict[str, tuple[int, ...]] = {}
    for face in FACES:
        axis = _NORMALS[face]
        source = list(range(24))
        for (cell, normal), index in stickers.items():
            if (
                sum(p * q for p, q in zip(cell, axis, strict=True)) > 0
            ):  # the sticker's cubie lies in the turning layer
                target = stickers[(_rotate_clockwise(cell, axis), _rotate_clockwise(normal, axis))]
                source[target] = index
        quarter[face] = tuple(source)
    perms = {}
    for face, perm in quarter.items():
        perms[face] = perm
        twice = tuple(perm[i] for i in perm)
        perms[face + "'"] = tuple(twice[i] for i in perm)
    return perms


def apply_move(state: tuple[int, ...], action: str) -> tuple[int, ...]:
    """The sticker colors after ``action``."""
    perm = move_permutations()[action]
    return tuple(state[i] for i in perm)


def is_solved(state: tuple[int, ...]) -> bool:
    """Every face shows a single color (the whole cube may sit in any orientation)."""
    return all(len(set(state[f * 4 : f * 4 + 4])) == 1 for f in range(6))


def scramble(seed: int, depth: int) -> tuple[tuple[int, ...], list[str]]:
    """RAGEN-2's scramble: ``depth`` uniformly random quarter turns from solved; redrawn (same generator) while the
    result is solved, so no instance starts solved."""
    rng = np.random.default_rng(seed)
    while True:
        moves = [ACTIONS[int(k)] for k in rng.integers(0, len(ACTIONS), size=depth)]
        state = SOLVED
        for move in moves:
            state = apply_move(state, move)
        if depth == 0 or not is_solved(state):
            return state, moves


# ---- the expert: an optimal quarter-turn solver --------------------------------------------------------------

_SOLVER_MOVES = ("U", "U'", "R", "R'", "F", "F'")  # faces away from the down-left-back corner, which stays put
_DLB_STICKERS = {"L": 6, "D": 22, "B": 19}  # reading positions of that corner's stickers on L, D and B


def _canonical(state: tuple[int, ...]) -> tuple[int, ...]:
    """``state`` recolored so that the down-left-back corner has its solved colors; with that corner fixed, the
    recolored state is solved exactly when it equals :data:`SOLVED`."""
    left, down, back = (state[_DLB_STICKERS[face]] for face in ("L", "D", "B"))
    relabel = {left: 1, OPPOSITE[left]: 3, down: 5, OPPOSITE[down]: 0, back: 4, OPPOSITE[back]: 2}
    return tuple(relabel[color] for color in state)


@lru_cache(maxsize=1)
def distance_table() -> dict[tuple[int, ...], int]:
    """Quarter-turn distance to :data:`SOLVED` of every state within :data:`TABLE_DEPTH` turns (U, R, F moves)."""
    table = {SOLVED: 0}
    frontier = [SOLVED]
    for depth in range(1, TABLE_DEPTH + 1):
        next_frontier = []
        for state in frontier:
            for move in _SOLVER_MOVES:
                child = apply_move(state, move)
                if child not in table:
                    table[child] = depth
                    next_frontier.append(child)
        frontier = next_frontier
    return table


def _inverse(move: str) -> str:
    return move[:-1] if move.endswith("'") else move + "'"


def _descend(state: tuple[int, ...], table: dict[tuple[int, ...], int]) -> list[str]:
    """A shortest path from a tabled state to solved, one table step at a time."""
    path = []
    while table[state] > 0:
        move = next(m for m in _SOLVER_MOVES if table.get(apply_move(state, m), TABLE_DEPTH + 1) == table[state] - 1)
        path.append(move)
        state = apply_move(state, move)
    return path


def solve(state: tuple[int, ...]) -> list[str]:
    """An optimal (fewest quarter turns) solution of ``state``: iterative deepening over U/R/F prefixes until a
    prefix reaches a tabled state; the first depth with a hit is optimal since the table holds every state within
    :data:`TABLE_DEPTH` turns."""
    table = distance_table()
    start = _canonical(state)

    def search(node: tuple[int, ...], depth: int, prefix: list[str]) -> list[str] | None:
        if depth == 0:
            return prefix + _descend(node, table) if node in table else None
        for move in _SOLVER_MOVES:
            if prefix and (move == _inverse(prefix[-1]) or prefix[-2:] == [move, move]):
                continue  # undoes the last move, or a third equal quarter turn (= one turn the other way)
            found = search(apply_move(node, move), depth - 1, prefix + [move])
            if found is not None:
                return found
        return None

    for depth in range(0, 15 - TABLE_DEPTH + 1):  # 14 quarter turns solve any 2x2 state
        found = search(start, depth, [])
        if found is not None:
            return found
    raise RuntimeError("no solution within 14 quarter turns: the state is not a legal 2x2 cube")


class RubiksCubeEnv(TextEnv):
    """A seeded scramble of the 2x2 cube, rendered face by face."""

    def __init__(self, scramble_depth: int = 5, max_steps: int = 20, name: str = "rubikscube") -> None:
        bounded("scramble_depth", scramble_depth, 1, MAX_SCRAMBLE_DEPTH)
        bounded("max_steps", max_steps, 1, MAX_ENV_STEPS)
        self.name, self.scramble_depth, self.max_steps = name, scramble_depth, max_steps
        self.state: tuple[int, ...] | None = None
        self.steps = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.state, moves = scramble(int(seed), self.scramble_depth)
        self.steps = 0
        return self.render(), {"success": False, "scramble": " ".join(moves)}

    def _require_state(self) -> tuple[int, ...]:
        if self.state is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self.state

    def step(self, action: str) -> StepResult:
        state = self._require_state()
        if self.success or self.steps >= self.max_steps:
            raise RuntimeError("the Rubik's Cube episode is over; call reset(seed) first")
        if action not in ACTIONS:
            info = {"success": False, "action_is_valid": False, "action_is_effective": False}
            return self.render(), 0.0, False, False, info
        self.steps += 1
        self.state = apply_move(state, action)
        solved = self.success
        info = {"success": solved, "action_is_valid": True, "action_is_effective": True}
        truncated = not solved and self.steps >= self.max_steps
        return self.render(), 1.0 if solved else 0.0, solved, truncated, info

    def render(self) -> str:
        state = self._require_state()
        lines = []
        for f, face in enumerate(FACES):
            colors = [COLORS[c] for c in state[f * 4 : f * 4 + 4]]
            label = f"{FACE_NAMES[face]} ({face}):"
            lines.append(f"{label:<11}[{colors[0]}, {colors[1]}]")
            lines.append(f"{'':<11}[{colors[2]}, {colors[3]}]")
        return "\n".join(lines)

    @property
    def action_names(self) -> list[str]:
        return list(ACTIONS)

    def instruction(self) -> str:
        return (
            "You are solving a 2x2 Rubik's Cube (Pocket Cube). Restore the cube so that each face shows a single "
            "color. Actions are face turns in Singmaster notation: U (Up), D (Down), L (Left), R (Right), F (Front), "
            "B (Back); a letter alone turns that face 90 degrees clockwise as seen looking at the face, a letter "
            "with a prime (') turns it counter-clockwise. Each face is shown as two rows of two stickers as seen "
            "looking at it (Up seen from above with Front at the bottom, Down from below with Front at the top). "
            "Colors: W white, O orange, G green, R red, B blue, Y yellow. Solving the cube gives reward 1."
        )

    @property
    def success(self) -> bool:
        return self.state is not None and is_solved(self.state)

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, 1.0

    def success_from_reward(self, env_reward: float) -> bool | None:
        """The only reward is 1 for the solved cube."""
        return env_reward > 0.5

    def expert_plan(self, actions_left: int) -> list[str]:
        """An optimal quarter-turn solution from the current state (U, R and F turns)."""
        return solve(self._require_state())


@register_env("rubikscube")
def make_rubikscube(**overrides: Any) -> RubiksCubeEnv:
    """RAGEN-2's pocket cube: scramble depth 5, 20 steps."""
    return RubiksCubeEnv(**{"name": "rubikscube", **overrides})
