"""Sokoban (RAGEN's SimpleSokoban, LargerSokoban and SokobanNewVocab): push every box onto a target.

Rules and rewards follow RAGEN (gym-sokoban): actions Up, Down, Left, Right; the player pushes a box by walking
into it when the cell beyond is free, and can never pull. Per step: -0.1, +1 for a box pushed onto a target, -1 for
a box pushed off one, +10 when every box is on a target (the components add up within a step). A move into a wall
or an immovable box leaves the state unchanged, still costs the step penalty, and is reported with
``info["action_is_effective"] = False``. The episode ends when solved (terminated) or after ``max_steps`` env steps
(truncated). Rooms come from :mod:`ragen_core.envs.sokoban_rooms` (reverse play, so always solvable).

``observation_format`` is RAGEN-2's option of the same name: ``grid`` (the character grid), ``coord`` (the board size
and the zero-indexed (row, col) of every target, box and the player) or ``grid_coord`` (both: RAGEN-2's CoordSokoban,
registered here as ``sokoban_coord``, which its base config trains on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ragen_core.envs.base import (
    MAX_ENV_STEPS,
    StepResult,
    TextEnv,
    Tile,
    bounded,
    bounded_reward,
    legend_symbols,
    legend_text,
    register_env,
)
from ragen_core.envs.sokoban_rooms import (
    GENERATORS,
    MOVES,
    Room,
    generate_room,
    optimal_first_moves,
    solve,
    step_state,
)


@dataclass(frozen=True)
class SokobanSymbols:
    """Render symbols of each cell kind."""

    wall: str
    floor: str
    target: str
    box: str
    box_on_target: str
    player: str
    player_on_target: str

    def tiles(self) -> tuple[Tile, ...]:
        """How each cell kind is drawn, in the order of the fields (the env's ``grid_legend``)."""
        return (
            Tile(self.wall, "wall", "#57534e", "wall"),
            Tile(self.floor, "floor", "#e0f2fe", "empty floor"),
            Tile(self.target, "target", "#fde68a", "target"),
            Tile(self.box, "box", "#b45309", "box"),
            Tile(self.box_on_target, "box-on-target", "#15803d", "box on target"),
            Tile(self.player, "player", "#2563eb", "you (the player)"),
            Tile(self.player_on_target, "player-on-target", "#2563eb", "you standing on a target"),
        )

    def legend(self) -> str:
        """The symbols in words, as the prompt states them (the tiles' labels)."""
        return legend_text(self.tiles())


OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")
CLASSIC_SYMBOLS = SokobanSymbols("#", "_", "O", "X", "\u221a", "P", "S")
# RAGEN's SokobanDifferentGridVocab: B is a box, C a box on a target.
NEW_VOCAB_SYMBOLS = SokobanSymbols("W", ".", "G", "B", "C", "A", "@")

# A room's generation (the reverse play) visits the states its boxes and player reach within ``search_depth`` moves:
# measured on one core, a 16x16 room with 3 boxes at depth 300 takes 2.5 s and 150 MB per reset, with 4 boxes 37 s
# and 2.5 GB. RAGEN's rooms are 6x6 to 10x10 with 1-2 boxes at depth 300 or less; the reverse play recurses once per
# move, so a depth near Python's recursion limit (1000) fails outright.
MAX_ROOM_SIDE = 16
MAX_BOXES = 3
MAX_SEARCH_DEPTH = 300
MAX_GEN_STEPS = 1_000  # the topology walk's steps (default 1.7 x (height + width))


def _room_sides(dim_room: Any) -> tuple[int, int]:
    """(height, width) of ``dim_room``: two whole numbers from 4 (a wall ring around the floor) to
    :data:`MAX_ROOM_SIDE`."""
    if not isinstance(dim_room, (list, tuple)) or len(dim_room) != 2:
        raise ValueError(f"dim_room must be [height, width], got {dim_room!r}"[:200])
    height, width = (bounded("dim_room's sides", side, 4, MAX_ROOM_SIDE) for side in dim_room)
    return height, width


class SokobanEnv(TextEnv):
    """One Sokoban room per seed; the state is rendered as a character grid (one row per line)."""

    held_out_maps = True  # a few thousand distinct 6x6 one-box rooms: seeds meet the same room

    def __init__(
        self,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 100,
        num_gen_steps: int | None = None,
        search_depth: int = 300,
        max_solution_steps: int | None = None,
        generator: str = "ragen",
        symbols: SokobanSymbols = CLASSIC_SYMBOLS,
        step_penalty: float = -0.1,
        box_on_target_reward: float = 1.0,
        box_off_target_penalty: float = -1.0,
        solved_reward: float = 10.0,
        observation_format: str = "grid",
        name: str = "sokoban",
    ) -> None:
        height, width = _room_sides(dim_room)
        bounded("num_boxes", num_boxes, 1, MAX_BOXES)
        bounded("max_steps", max_steps, 1, MAX_ENV_STEPS)
        bounded("search_depth", search_depth, 1, MAX_SEARCH_DEPTH)
        if num_gen_steps is not None:
            bounded("num_gen_steps", num_gen_steps, 1, MAX_GEN_STEPS)
        if max_solution_steps is not None:
            bounded("max_solution_steps (a positive move count or None)", max_solution_steps, 1, MAX_ENV_STEPS)
        rewards = {
            "step_penalty": step_penalty,
            "box_on_target_reward": box_on_target_reward,
            "box_off_target_penalty": box_off_target_penalty,
            "solved_reward": solved_reward,
        }
        for option, value in rewards.items():
            bounded_reward(option, value)
        if generator not in GENERATORS:
            raise ValueError(f"generator must be one of {', '.join(GENERATORS)}, got {generator!r}")
        if observation_format not in OBSERVATION_FORMATS:
            raise ValueError(f"observation_format must be one of {OBSERVATION_FORMATS}, got {observation_format!r}")
        self.observation_format = observation_format
        self.name, self.generator = name, generator
        self.height, self.width, self.num_boxes = height, width, num_boxes
        self.max_steps, self.search_depth, self.max_solution_steps = max_steps, search_depth, max_solution_steps
        # RAGEN (gym-sokoban's env) walks int(1.7 * (height + width)) steps when carving the topology.
        self.num_gen_steps = num_gen_steps if num_gen_steps is not None else int(1.7 * (height + width))
        self.symbols = symbols
        self.grid_legend = symbols.tiles()
        self.grid_symbols = legend_symbols(self.grid_legend)
        self.step_penalty, self.solved_reward = step_penalty, solved_reward
        self.box_on_target_reward, self.box_off_target_penalty = box_on_target_reward, box_off_target_penalty
        self.room: Room | None = None
        self._player = 0
        self._boxes: tuple[int, ...] = ()
        self._steps = 0
        self._teacher_cache: dict[tuple[int, tuple[int, ...]], list[str] | None] = {}

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.room = generate_room(
            int(seed),
            self.height,
            self.width,
            self.num_boxes,
            num_steps=self.num_gen_steps,
            search_depth=self.search_depth,
            max_solution_steps=self.max_solution_steps,
            generator=self.generator,
        )
        self._player, self._boxes, self._steps = self.room.player, self.room.boxes, 0
        self._teacher_cache.clear()
        return self.render(), {"success": False, "optimal_steps": self.room.optimal_steps}

    def load_room(self, room: Room) -> str:
        """Start from a given room instead of a generated one (hand-made puzzles, curated sets)."""
        if (room.height, room.width) != (self.height, self.width) or len(room.boxes) != self.num_boxes:
            raise ValueError(
                f"room is {room.height}x{room.width} with {len(room.boxes)} box(es); this env expects "
                f"{self.height}x{self.width} with {self.num_boxes}"
            )
        self.room = room
        self._player, self._boxes, self._steps = room.player, room.boxes, 0
        self._teacher_cache.clear()
        return self.render()

    def _room(self) -> Room:
        if self.room is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self.room

    def _on_target(self, boxes: tuple[int, ...]) -> int:
        return sum(box in self._room().targets for box in boxes)

    def step(self, action: str) -> StepResult:
        room = self._room()
        if self.success or self._steps >= self.max_steps:
            raise RuntimeError("the Sokoban episode is over; call reset(seed) first")
        if action not in MOVES:
            info = {"success": False, "action_is_valid": False, "action_is_effective": False}
            return self.render(), 0.0, False, False, info
        self._steps += 1
        before = self._on_target(self._boxes)
        successor = step_state((self._player, self._boxes), MOVES[action], room.floor, room.width)
        if successor is not None:
            self._player, self._boxes = successor
        after = self._on_target(self._boxes)
        reward = self.step_penalty
        if after > before:
            reward += self.box_on_target_reward
        elif after < before:
            reward += self.box_off_target_penalty
        solved = self.success
        if solved:
            reward += self.solved_reward
        info = {
            "success": solved,
            "action_is_valid": True,
            "action_is_effective": successor is not None,
            "boxes_on_target": after,
        }
        return self.render(), float(reward), solved, not solved and self._steps >= self.max_steps, info

    def render(self) -> str:
        """The state in the ``observation_format``: the grid, the coordinates, or RAGEN-2's ``Coordinates:`` block
        followed by ``Grid Map:`` and the grid."""
        if self.observation_format == "grid":
            return self.grid_text()
        if self.observation_format == "coord":
            return self.coordinates()
        return "Coordinates: \n" + self.coordinates() + "\nGrid Map: \n" + self.grid_text()

    def coordinates(self) -> str:
        """RAGEN-2's coordinate render: the board size, then the zero-indexed (row, col) of the targets (covered or
        not), the boxes off and on targets and the player (off or on a target), row by row; empty kinds left out."""
        room, boxes = self._room(), set(self._boxes)
        kinds = [
            ("Targets", sorted(room.targets)),
            ("Boxes", sorted(boxes - set(room.targets))),
            ("Boxes on target", sorted(boxes & set(room.targets))),
            ("Player", [self._player] if self._player not in room.targets else []),
            ("Player on target", [self._player] if self._player in room.targets else []),
        ]
        lines = [f"Board size: {room.height} rows x {room.width} cols (zero-indexed)."]
        for label, cells in kinds:
            if cells:
                lines.append(f"{label}: " + ", ".join("({}, {})".format(*room.position(cell)) for cell in cells))
        return "\n".join(lines)

    def map_key(self) -> str:
        """The room as it starts: its size, floor, targets, boxes and player (cells), whatever its symbols."""
        room = self._room()
        return json.dumps(
            [room.height, room.width, sorted(room.floor), sorted(room.targets), sorted(self._boxes), self._player]
        )

    def grid_text(self) -> str:
        """The character grid, one row per line."""
        room, sym = self._room(), self.symbols
        boxes = set(self._boxes)
        rows = []
        for row in range(room.height):
            chars = []
            for col in range(room.width):
                cell = room.cell(row, col)
                on_target = cell in room.targets
                if cell not in room.floor:
                    chars.append(sym.wall)
                elif cell == self._player:
                    chars.append(sym.player_on_target if on_target else sym.player)
                elif cell in boxes:
                    chars.append(sym.box_on_target if on_target else sym.box)
                else:
                    chars.append(sym.target if on_target else sym.floor)
            rows.append("".join(chars))
        return "\n".join(rows)

    @property
    def action_names(self) -> list[str]:
        return list(MOVES)

    def instruction(self) -> str:
        text = (
            "You are solving a Sokoban puzzle. You are the player and must push every box onto a target. "
            "Walking into a box pushes it one cell in the same direction if the cell beyond it is free; "
            "you cannot pull boxes, and walls and other boxes block a push.\n"
        )
        if self.observation_format != "coord":
            text += f"The symbols of the state are: {self.symbols.legend()}."
        if self.observation_format != "grid":
            shown = "a symbol grid and " if self.observation_format == "grid_coord" else ""
            text += (
                f"{' ' if shown else ''}You are provided with {shown}the zero-indexed (row, column) coordinates of "
                "the player, each box, and each target. Coordinates range from the top-left corner (0, 0) to the "
                f"bottom-right corner ({self.height - 1}, {self.width - 1})."
            )
        return text

    def brief(self) -> str:
        sym = self.symbols
        if self.observation_format == "coord":
            return "Push every box onto a target; coordinates are (row, col) from (0, 0) at the top left."
        return f"You are {sym.player}. Push {sym.box} onto {sym.target}; {sym.wall} is wall."

    @property
    def success(self) -> bool:
        return self.room is not None and self._on_target(self._boxes) == self.num_boxes

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        # Boxes start off their targets, so every -1 follows a +1: the net box reward lies in [0, num_boxes].
        steps = max(1, min(max_actions, self.max_steps))
        low = steps * self.step_penalty
        high = self.step_penalty + self.num_boxes * self.box_on_target_reward + self.solved_reward
        return low, high

    def success_from_reward(self, env_reward: float) -> bool | None:
        """Solved iff the env reward exceeds what the boxes alone can earn (the +10 dominates every step penalty the
        step limit allows); None when the step penalties could outweigh the solve bonus."""
        if -self.step_penalty * self.max_steps >= self.solved_reward:
            return None
        return env_reward > self.num_boxes * self.box_on_target_reward

    @property
    def state(self) -> tuple[int, tuple[int, ...]]:
        """The current (player cell, sorted box cells)."""
        return self._player, self._boxes

    def expert_plan(self, actions_left: int) -> list[str]:
        """A shortest solution from the current state (breadth-first search over the room)."""
        plan = solve(self._room(), self.state, max_depth=300)  # independent of the generator's search depth
        return plan if plan is not None else []

    def teacher_actions(self, actions_left: int) -> list[str] | None:
        """Every move that starts a shortest solution from the current state (breadth-first, ties all kept);
        None when the room cannot be solved from here (a box pushed into a corner)."""
        state = self.state
        if state not in self._teacher_cache:  # emptied whenever the room changes
            self._teacher_cache[state] = optimal_first_moves(self._room(), state)
        moves = self._teacher_cache[state]
        return list(moves) if moves else None

    def describe(self) -> str:
        """Where the nearest box off target lies from the player, and its nearest free target from the box ("The
        box is up and left. The target is down."); "The boxes are on their targets." when solved."""
        room, width = self._room(), self.width
        loose = [box for box in self._boxes if box not in room.targets]
        if not loose:
            return "The boxes are on their targets."
        free = [target for target in room.targets if target not in self._boxes]
        box = min(loose, key=lambda cell: _distance(self._player, cell, width))
        target = min(free, key=lambda cell: _distance(box, cell, width))
        return f"The box is {_direction(self._player, box, width)}. The target is {_direction(box, target, width)}."


def _distance(a: int, b: int, width: int) -> int:
    return abs(a // width - b // width) + abs(a % width - b % width)


def _direction(origin: int, cell: int, width: int) -> str:
    """Where ``cell`` lies from ``origin``: "up", "down and left", ... (rows first)."""
    parts = []
    if cell // width != origin // width:
        parts.append("down" if cell // width > origin // width else "up")
    if cell % width != origin % width:
        parts.append("right" if cell % width > origin % width else "left")
    return " and ".join(parts) or "here"


@register_env("sokoban")
def make_sokoban(**overrides: Any) -> SokobanEnv:
    """RAGEN's SimpleSokoban: 6x6 room, one box, RAGEN's generator (topology walk ``int(1.7 * (6 + 6)) = 20``
    steps, reverse search depth 300). ``generator="bfs"`` gives our harder breadth-first rooms instead."""
    return SokobanEnv(**{"dim_room": (6, 6), "num_boxes": 1, "search_depth": 300, "name": "sokoban", **overrides})


@register_env("sokoban_coord")
def make_sokoban_coord(**overrides: Any) -> SokobanEnv:
    """RAGEN-2's CoordSokoban (the env its base config trains and validates on): ``sokoban``'s 6x6 one-box rooms,
    shown as the zero-indexed coordinates of the targets, boxes and player followed by the grid."""
    defaults = {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 300, "observation_format": "grid_coord"}
    return SokobanEnv(**{**defaults, "name": "sokoban_coord", **overrides})


@register_env("sokoban_large")
def make_sokoban_large(**overrides: Any) -> SokobanEnv:
    """RAGEN's LargerSokoban: 8x8 room, two boxes, reverse search depth 10 (as RAGEN configures it)."""
    return SokobanEnv(**{"dim_room": (8, 8), "num_boxes": 2, "search_depth": 10, "name": "sokoban_large", **overrides})


@register_env("sokoban_new_vocab")
def make_sokoban_new_vocab(**overrides: Any) -> SokobanEnv:
    """RAGEN's SokobanDifferentGridVocab: 6x6 rooms, one box, reverse search depth 30, rendered with other symbols
    (W wall, . floor, G target, B box, C box on target, A player, @ player on target)."""
    defaults = {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30, "symbols": NEW_VOCAB_SYMBOLS}
    return SokobanEnv(**{**defaults, "name": "sokoban_new_vocab", **overrides})
