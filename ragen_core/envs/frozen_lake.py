"""FrozenLake (RAGEN's): reach the goal across a slippery lake without falling into a hole.

The dynamics are Gymnasium's ``FrozenLakeEnv`` (slippery: the intended move with probability ``success_rate`` = 1/3,
each perpendicular move 1/3, never the opposite; bumping into the edge leaves the player in place; reward 1 at the
goal, else 0; a hole or the goal ends the episode). What RAGEN adds and we add too: a map drawn from the seed with
random start and goal cells, each other tile frozen with probability ``p`` (0.8), redrawn until the goal is reachable,
and a text rendering. Slips come from a generator seeded from the env seed, so one seed and one action sequence
always give the same trajectory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from ragen_core.envs.base import StepResult, TextEnv, Tile, bounded, legend_symbols, legend_text, register_env
from ragen_core.seeding import derive_seed

# Action names in Gymnasium's order: 0 Left, 1 Down, 2 Right, 3 Up.
ACTIONS = ("Left", "Down", "Right", "Up")
SYMBOLS = {"player": "P", "frozen": "_", "hole": "O", "goal": "G", "player_in_hole": "X", "player_on_goal": "\u221a"}
# How each cell is drawn, in the order the prompt's legend states them (its labels are the legend's words).
LEGEND = (
    Tile(SYMBOLS["player"], "player", "#2563eb", "you"),
    Tile(SYMBOLS["frozen"], "ice", "#e0f2fe", "frozen ice"),
    Tile(SYMBOLS["hole"], "hole", "#1e3a8a", "hole"),
    Tile(SYMBOLS["goal"], "goal", "#fde68a", "goal"),
    Tile(SYMBOLS["player_in_hole"], "player-in-hole", "#b91c1c", "you in a hole"),
    Tile(SYMBOLS["player_on_goal"], "player-on-goal", "#16a34a", "you on the goal"),
)


def goal_reachable(rows: list[str]) -> bool:
    """Whether a path of non-hole tiles joins the start ``S`` to the goal ``G`` (4-connected)."""
    size_r, size_c = len(rows), len(rows[0])
    start = next((r, c) for r in range(size_r) for c in range(size_c) if rows[r][c] == "S")
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == "G":
            return True
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < size_r and 0 <= nc < size_c and (nr, nc) not in seen and rows[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append((nr, nc))
    return False


@lru_cache(maxsize=4096)
def generate_map(seed: int, size: int = 4, p: float = 0.8, max_tries: int = 10_000) -> tuple[str, ...]:
    """The map of ``seed``: rows of ``S`` start, ``G`` goal, ``F`` frozen, ``H`` hole, with the goal reachable."""
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        board = np.where(rng.random((size, size)) < p, "F", "H")
        start, goal = rng.choice(size * size, 2, replace=False)
        board[divmod(int(start), size)] = "S"
        board[divmod(int(goal), size)] = "G"
        rows = ["".join(row) for row in board]
        if goal_reachable(rows):
            return tuple(rows)
    raise RuntimeError(f"no {size}x{size} map with a reachable goal in {max_tries} tries at p={p}; raise p")


# A map's side: the teacher's and the success tables hold size^2 states per remaining step (32: 0.1 s per map).
MAX_SIDE = 32


def _map_rows(desc: Any) -> list[str]:
    """A given map's rows: a list of at most :data:`MAX_SIDE` strings of at most :data:`MAX_SIDE` characters."""
    if not isinstance(desc, (list, tuple)) or not all(isinstance(row, str) for row in desc):
        raise ValueError(f"desc must be a list of rows (strings), got {desc!r}"[:200])
    bounded("desc's number of rows", len(desc), 1, MAX_SIDE)
    bounded("desc's row length", max(len(row) for row in desc), 1, MAX_SIDE)
    return list(desc)


class FrozenLakeEnv(TextEnv):
    """A seeded FrozenLake map over Gymnasium's dynamics, rendered as a character grid."""

    grid_legend = LEGEND
    grid_symbols = legend_symbols(LEGEND)
    held_out_maps = True  # 4x4 lakes drawn with p=0.8: seeds meet the same lake

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = True,
        success_rate: float = 1.0 / 3.0,
        desc: list[str] | None = None,
        name: str = "frozen_lake",
    ) -> None:
        bounded("size", size, 2, MAX_SIDE)
        if not 0.0 < bounded("p (the frozen-tile probability)", p, 0.0, 1.0, integer=False):
            raise ValueError(f"p (the frozen-tile probability) must lie in (0, 1], got {p}")
        bounded("success_rate", success_rate, 0.0, 1.0, integer=False)
        if desc is not None and not goal_reachable(_map_rows(desc)):
            raise ValueError(f"the given map {desc} has no path from S to G")
        self.name = name
        self.size, self.p, self.is_slippery, self.success_rate = size, p, is_slippery, success_rate
        self.desc = list(desc) if desc is not None else None
        self.held_out_maps = desc is None  # one given map: nothing to hold out
        self._lake: Any = None
        self.rows: list[str] = []

    def map_key(self) -> str:
        """The lake as it starts: its rows of start, frozen, hole and goal tiles (the player starts on S)."""
        return "\n".join(self.rows)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

        self.rows = self.desc if self.desc is not None else list(generate_map(int(seed), self.size, self.p))
        self._lake = GymFrozenLake(desc=self.rows, is_slippery=self.is_slippery, success_rate=self.success_rate)
        self._lake.reset(seed=derive_seed(int(seed), "frozen_lake/slips"))
        return self.render(), {"success": False}

    def _require_lake(self) -> Any:
        if self._lake is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self._lake

    @property
    def position(self) -> tuple[int, int]:
        """The player's (row, col)."""
        return divmod(int(self._require_lake().s), len(self.rows[0]))

    @property
    def transitions(self) -> dict[int, dict[int, list[tuple[float, int, float, bool]]]]:
        """Gymnasium's transition table ``P[state][action] = [(probability, next_state, reward, terminated)]``."""
        return self._require_lake().P

    def _tile(self) -> str:
        row, col = self.position
        return self.rows[row][col]

    def step(self, action: str) -> StepResult:
        lake = self._require_lake()
        if self._tile() in "GH":
            raise RuntimeError("the FrozenLake episode is over; call reset(seed) first")
        if action not in ACTIONS:
            info = {"success": False, "action_is_valid": False, "action_is_effective": False}
            return self.render(), 0.0, False, False, info
        before = int(lake.s)
        _, reward, terminated, truncated, _ = lake.step(ACTIONS.index(action))
        info = {
            "success": self.success,
            "action_is_valid": True,
            "action_is_effective": int(lake.s) != before,
            "fell_in_hole": self._tile() == "H",
        }
        return self.render(), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str:
        player = self.position
        lines = []
        for r, row in enumerate(self.rows):
            chars = []
            for c, tile in enumerate(row):
                if (r, c) == player:
                    key = {"H": "player_in_hole", "G": "player_on_goal"}.get(tile, "player")
                else:
                    key = {"H": "hole", "G": "goal"}.get(tile, "frozen")
                chars.append(SYMBOLS[key])
            lines.append("".join(chars))
        return "\n".join(lines)

    @property
    def action_names(self) -> list[str]:
        return list(ACTIONS)

    def instruction(self) -> str:
        slip = (
            "The ice is slippery: you may slide to a side instead of moving where you intended. "
            if self.is_slippery
            else ""
        )
        legend = legend_text(self.grid_legend)
        return (
            "You are walking on a frozen lake and must reach the goal without falling into a hole. "
            f"{slip}Reaching the goal gives reward 1.\nThe symbols of the state are: {legend}."
        )

    def brief(self) -> str:
        return "Reach G, avoid O."

    def describe(self) -> str:
        """Where the goal lies from the player: "The goal is down and right." (rows first; "here" on the goal)."""
        (row, col), parts = self.position, []
        goal_row, goal_col = next((r, line.index("G")) for r, line in enumerate(self.rows) if "G" in line)
        if goal_row != row:
            parts.append("down" if goal_row > row else "up")
        if goal_col != col:
            parts.append("right" if goal_col > col else "left")
        return f"The goal is {' and '.join(parts) or 'here'}."

    @property
    def success(self) -> bool:
        return self._lake is not None and self._tile() == "G"

    def end_reason(self) -> str:
        """``"hole"`` when the player fell into one, else the base reason (``"success"`` on the goal)."""
        return "hole" if self._lake is not None and self._tile() == "H" else super().end_reason()

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, 1.0

    def success_from_reward(self, env_reward: float) -> bool | None:
        """The only reward is 1 at the goal."""
        return env_reward > 0.5

    def success_table(self, horizon: int) -> np.ndarray:
        """``Q[t, s, a]``: the optimal probability of reaching the goal within ``t`` actions after taking ``a`` in
        ``s`` (value iteration over Gymnasium's transitions), for ``t = 0..horizon``."""
        return _success_table(tuple(self.rows), self.is_slippery, self.success_rate, horizon, self.transitions)

    def expert_plan(self, actions_left: int) -> list[str]:
        """One action of highest success probability within the remaining budget (re-planned every step, since
        slips make a longer plan unreliable). Ties go to the first action in Gymnasium's order."""
        horizon = max(1, actions_left)
        q_values = self.success_table(horizon)[horizon, int(self._require_lake().s)]
        return [ACTIONS[int(np.argmax(q_values))]]

    def teacher_actions(self, actions_left: int) -> list[str]:
        """The "safe and soonest" teacher's moves: among the actions of highest success probability within the
        budget, those that reach the goal soonest (highest ``TEACHER_DISCOUNT ** steps`` in expectation), ties all
        kept. :meth:`expert_plan` maximises success alone, so with budget to spare most actions tie and it drifts to
        the first of them (Left); this teacher walks to the goal. Where no action can reach the goal, all tie."""
        horizon = max(1, actions_left)
        safe, soon = _teacher_tables(tuple(self.rows), self.is_slippery, self.success_rate, horizon, self.transitions)
        state = int(self._require_lake().s)
        best = _ties(safe[horizon, state], np.ones(len(ACTIONS), dtype=bool))
        best = _ties(soon[horizon, state], best)
        return [name for name, keep in zip(ACTIONS, best, strict=True) if keep]


TEACHER_DISCOUNT = 0.9  # how the teacher weighs a later arrival against a sooner one (second criterion only)
_TIE_TOLERANCE = 1e-9
_TABLE_CACHE: dict[tuple, tuple[np.ndarray, ...]] = {}  # (kind, map, dynamics) -> tables


def _ties(values: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Which of the ``allowed`` entries are within the tolerance of their best value."""
    best = values[allowed].max()
    return allowed & (values >= best - _TIE_TOLERANCE)


def _cached(key: tuple, horizon: int, build: Callable[[int], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """The tables of ``key`` for ``horizon`` actions (``build(horizon)`` once). Row ``t`` of every table depends on
    ``t`` alone, so tables built for a longer horizon serve every shorter one, sliced: an episode asks for its budget
    first, then one action less each turn, and is served by one build per map."""
    tables = _TABLE_CACHE.get(key)
    if tables is None or len(tables[0]) <= horizon:
        if len(_TABLE_CACHE) > 4096:
            _TABLE_CACHE.clear()
        tables = _TABLE_CACHE[key] = build(horizon)
    return tuple(table[: horizon + 1] for table in tables)


def _teacher_tables(
    rows: tuple[str, ...], slippery: bool, rate: float, horizon: int, transitions
) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographic value iteration: ``safe[t, s, a]`` is the success probability within ``t`` actions (as
    :func:`_success_table`), ``soon[t, s, a]`` the expected ``TEACHER_DISCOUNT ** (arrival step - 1)`` when acting by
    the safest actions afterwards, choosing the soonest among them."""

    def build(horizon: int) -> tuple[np.ndarray, np.ndarray]:
        safe = _success_table(rows, slippery, rate, horizon, transitions)
        flat = "".join(rows)
        n_states = len(flat)
        terminal = np.array([tile in "GH" for tile in flat])
        goal = np.array([tile == "G" for tile in flat], dtype=float)
        soon = np.zeros_like(safe)
        value = np.zeros(n_states)  # V_0: nothing more to collect with no action left
        for t in range(1, horizon + 1):
            for s in range(n_states):
                for a in range(len(ACTIONS)):
                    soon[t, s, a] = sum(
                        prob * (goal[nxt] + (0.0 if terminal[nxt] else TEACHER_DISCOUNT * value[nxt]))
                        for prob, nxt, _, _ in transitions[s][a]
                    )
            value = np.array(
                [
                    0.0 if terminal[s] else soon[t, s][_ties(safe[t, s], np.ones(len(ACTIONS), dtype=bool))].max()
                    for s in range(n_states)
                ]
            )
        return safe, soon

    safe, soon = _cached(("teacher", rows, slippery, rate), horizon, build)
    return safe, soon


def _success_table(rows: tuple[str, ...], slippery: bool, rate: float, horizon: int, transitions) -> np.ndarray:
    def build(horizon: int) -> tuple[np.ndarray]:
        n_states = len(rows) * len(rows[0])
        flat = "".join(rows)
        value = np.array([1.0 if tile == "G" else 0.0 for tile in flat])  # V_0: success already achieved
        q_table = np.zeros((horizon + 1, n_states, len(ACTIONS)))
        for t in range(1, horizon + 1):
            for s in range(n_states):
                for a in range(len(ACTIONS)):
                    q_table[t, s, a] = sum(prob * value[nxt] for prob, nxt, _, _ in transitions[s][a])
            value = np.where(np.array([tile in "GH" for tile in flat]), value, q_table[t].max(axis=1))
        return (q_table,)

    return _cached(("success", rows, slippery, rate), horizon, build)[0]


@register_env("frozen_lake")
def make_frozen_lake(**overrides: Any) -> FrozenLakeEnv:
    """RAGEN's FrozenLake: 4x4, frozen-tile probability 0.8, slippery."""
    return FrozenLakeEnv(**{"name": "frozen_lake", **overrides})
