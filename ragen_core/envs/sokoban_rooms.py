"""Sokoban rooms: generation by reverse play, and an optimal solver. Pure functions over small integer grids.

A room is a grid of ``height x width`` cells indexed ``row * width + col``; the outer ring is always wall. A state is
the player's cell and the sorted tuple of box cells. Two generators share the topology step:

1. carve a random topology: a random walk over the interior (changing direction with probability
   ``p_change_directions``) that clears a small random shape around every position;

then, ``generator="ragen"`` (the default, RAGEN's gym-sokoban generator):

2. put the player on a random floor cell and the targets on other random floor cells, with the boxes on them;
3. play in reverse from that one solved state, depth first (each state expanded once, at most ``search_depth``
   reverse moves deep), where a reverse move walks one cell and pulls the box behind the player if there is one;
   score every state by ``box swaps x box displacement`` (swaps: how often the pulled box changed; displacement:
   the summed Manhattan distance of each box from the target it started on), score 0 while any target is covered
   (by a box or by the player), and keep the FIRST state of the best score;
4. walk the player a few random steps (probability 0.8 when the displacement is 1, else 0.5; up to 3 steps, never
   back onto a visited cell, continuing with probability 0.5), so the player does not always start beside a box.

or ``generator="bfs"`` (ours, kept as an option): put targets with boxes, explore breadth-first every state reachable
by reverse moves (walk, or walk while pulling) from every solved state, and pick among the states with no box on a
target one with the largest box displacement (to the nearest target), ties broken by the seed's generator. Its rooms
are harder (farther from solved). ``max_solution_steps`` (off by default, as in RAGEN) restricts the BFS candidates
to rooms solvable within that many moves, and makes the RAGEN generator redraw rooms that need more.

Reverse moves are exact inverses of forward moves, so every generated room is solvable; the reported
``optimal_steps`` is the length of a shortest forward solution (breadth-first search).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Action names in RAGEN's order, with their (row, col) offsets.
MOVES: dict[str, tuple[int, int]] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}

# Shapes cleared around each position of the topology walk, as (row, col) offsets.
_CARVE_SHAPES: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
_DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))

State = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class Room:
    """A generated Sokoban instance: static layout plus the initial state and its optimal solution length."""

    height: int
    width: int
    floor: frozenset[int]  # every non-wall cell
    targets: tuple[int, ...]
    player: int
    boxes: tuple[int, ...]
    optimal_steps: int

    def cell(self, row: int, col: int) -> int:
        return row * self.width + col

    def position(self, cell: int) -> tuple[int, int]:
        return divmod(cell, self.width)


def carve_topology(
    rng: np.random.Generator, height: int, width: int, p_change_directions: float, num_steps: int
) -> frozenset[int]:
    """Floor cells cleared by a random walk over the interior of a ``height x width`` room of walls."""
    floor: set[int] = set()
    row, col = int(rng.integers(1, height - 1)), int(rng.integers(1, width - 1))
    direction = _DIRECTIONS[int(rng.integers(0, 4))]
    for _ in range(num_steps):
        if rng.random() < p_change_directions:
            direction = _DIRECTIONS[int(rng.integers(0, 4))]
        row = min(max(row + direction[0], 1), height - 2)
        col = min(max(col + direction[1], 1), width - 2)
        for d_row, d_col in _CARVE_SHAPES[int(rng.integers(0, len(_CARVE_SHAPES)))]:
            r, c = row + d_row, col + d_col
            if 1 <= r <= height - 2 and 1 <= c <= width - 2:
                floor.add(r * width + c)
    return frozenset(floor)


def _reverse_successors(state: State, floor: frozenset[int], offsets: tuple[int, ...]):
    """States reachable by one reverse move: walk to a free cell, optionally pulling the box behind the player."""
    player, boxes = state
    box_set = set(boxes)
    for offset in offsets:
        target = player + offset
        if target not in floor or target in box_set:
            continue
        yield target, boxes
        behind = player - offset
        if behind in box_set:
            yield target, tuple(sorted((box_set - {behind}) | {player}))


def _displacement(boxes: tuple[int, ...], targets: tuple[int, ...], width: int) -> int:
    return sum(min(abs(b // width - t // width) + abs(b % width - t % width) for t in targets) for b in boxes)


def reverse_play(
    floor: frozenset[int],
    targets: tuple[int, ...],
    width: int,
    rng: np.random.Generator,
    search_depth: int,
    max_solution_steps: int | None = None,
) -> tuple[State, int] | None:
    """Breadth-first reverse play from every solved state; the chosen start state and its optimal length, or None
    when no state with every box off its target is reachable."""
    offsets = tuple(d_row * width + d_col for d_row, d_col in MOVES.values())
    solved = tuple(sorted(targets))
    frontier = [(player, solved) for player in sorted(floor - set(targets))]
    depth_of: dict[State, int] = dict.fromkeys(frontier, 0)
    target_set = set(targets)
    best_score, best = 0, []
    depth_limit = search_depth if max_solution_steps is None else min(search_depth, max_solution_steps)
    for depth in range(1, depth_limit + 1):
        next_frontier = []
        for state in frontier:
            for successor in _reverse_successors(state, floor, offsets):
                if successor in depth_of:
                    continue
                depth_of[successor] = depth
                next_frontier.append(successor)
                if target_set.intersection(successor[1]):
                    continue
                score = _displacement(successor[1], targets, width)
                if score > best_score:
                    best_score, best = score, [successor]
                elif score == best_score and score > 0:
                    best.append(successor)
        if not next_frontier:
            break
        frontier = next_frontier
    if not best:
        return None
    chosen = best[int(rng.integers(0, len(best)))]
    return chosen, depth_of[chosen]


class _DepthFirstReversePlay:
    """RAGEN's reverse play: a depth-first search from one solved state that keeps the first best-scoring state.

    The search state mirrors RAGEN's grid: besides the player and the box cells it tells boxes that were never pulled
    (still on their own target) from pulled ones, so two grids that differ only in that are explored separately.
    """

    def __init__(self, floor: frozenset[int], targets: tuple[int, ...], width: int, max_states: int) -> None:
        self.floor, self.targets, self.width, self.max_states = floor, targets, width, max_states
        self.offsets = tuple(d_row * width + d_col for d_row, d_col in MOVES.values())
        self.explored: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
        self.best_score = -1
        self.best: tuple[int, tuple[int, ...]] = (-1, ())

    def displacement(self, boxes: tuple[int, ...]) -> int:
        """Summed Manhattan distance of every box from the target it started on."""
        w = self.width
        return sum(abs(b // w - t // w) + abs(b % w - t % w) for b, t in zip(boxes, self.targets, strict=True))

    def score(self, player: int, boxes: tuple[int, ...], swaps: int) -> int:
        """``swaps x displacement``, or 0 while a box or the player covers a target (RAGEN counts empty targets)."""
        if (set(boxes) | {player}).intersection(self.targets):
            return 0
        return swaps * self.displacement(boxes)

    def search(self, player: int, boxes: tuple[int, ...], pulled: tuple[bool, ...], swaps: int, last: int, ttl: int):
        ttl -= 1
        if ttl <= 0 or len(self.explored) >= self.max_states:
            return
        key = (
            player,
            tuple(sorted(b for b, p in zip(boxes, pulled, strict=True) if p)),
            tuple(sorted(b for b, p in zip(boxes, pulled, strict=True) if not p)),
        )
        if key in self.explored:
            return
        score = self.score(player, boxes, swaps)
        if score > self.best_score:  # strictly greater: the first state of the best score stays
            self.best_score, self.best = score, (player, boxes)
        self.explored.add(key)
        for offset in self.offsets:
            step = player + offset
            if step not in self.floor or step in boxes:
                continue
            behind = player - offset
            if behind in boxes:  # a reverse move always pulls the box behind the player
                index = boxes.index(behind)
                moved = boxes[:index] + (player,) + boxes[index + 1 :]
                now_pulled = pulled[:index] + (True,) + pulled[index + 1 :]
                self.search(step, moved, now_pulled, swaps + (index != last), index, ttl)
            else:
                self.search(step, boxes, pulled, swaps, last, ttl)


def _random_walk(
    rng: np.random.Generator, player: int, boxes: tuple[int, ...], floor: frozenset[int], width: int, displacement: int
) -> int:
    """RAGEN's final touch: the player walks up to 3 random steps over free cells it has not visited."""
    if rng.random() > (0.8 if displacement == 1 else 0.5):
        return player
    visited = [player]
    offsets = tuple(d_row * width + d_col for d_row, d_col in MOVES.values())
    for _ in range(3):
        options = [player + o for o in offsets if player + o in floor and player + o not in boxes]
        options = [cell for cell in options if cell not in visited]
        if not options:
            break
        player = options[int(rng.integers(0, len(options)))]
        visited.append(player)
        if len(visited) > 3 or rng.random() > 0.5:
            break
    return player


def ragen_reverse_play(
    floor: frozenset[int], width: int, num_boxes: int, rng: np.random.Generator, search_depth: int
) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """Place player and targets, play in reverse depth first, walk the player: ``(targets, player, boxes)``, or None
    when no state with a positive score is reachable (the caller draws another topology)."""
    cells = sorted(floor)
    if len(cells) <= num_boxes + 1:
        return None
    player = cells[int(rng.integers(0, len(cells)))]
    free = [cell for cell in cells if cell != player]
    targets = tuple(free[int(i)] for i in rng.choice(len(free), num_boxes, replace=False))
    play = _DepthFirstReversePlay(floor, targets, width, max_states=300_000)
    play.search(player, targets, (False,) * num_boxes, swaps=0, last=-1, ttl=search_depth)
    if play.best_score <= 0:
        return None
    start, boxes = play.best
    start = _random_walk(rng, start, boxes, floor, width, play.displacement(boxes))
    return tuple(sorted(targets)), start, tuple(sorted(boxes))


GENERATORS = ("ragen", "bfs")


@lru_cache(maxsize=4096)
def generate_room(
    seed: int,
    height: int = 6,
    width: int = 6,
    num_boxes: int = 1,
    p_change_directions: float = 0.35,
    num_steps: int | None = None,
    search_depth: int = 300,
    max_solution_steps: int | None = None,
    max_tries: int = 100,
    generator: str = "ragen",
) -> Room:
    """The room of ``seed`` (cached: every member of a group resets to the same room)."""
    if generator not in GENERATORS:
        raise ValueError(f"unknown Sokoban generator {generator!r}; choose one of {', '.join(GENERATORS)}")
    rng = np.random.default_rng(seed)
    steps = num_steps if num_steps is not None else int(1.7 * (height + width))
    for _ in range(max_tries):
        floor = carve_topology(rng, height, width, p_change_directions, steps)
        if len(floor) < num_boxes + 2:
            continue
        if generator == "bfs":
            cells = sorted(floor)
            targets = tuple(sorted(cells[int(i)] for i in rng.choice(len(cells), num_boxes, replace=False)))
            found = reverse_play(floor, targets, width, rng, search_depth, max_solution_steps)
            if found is not None:
                (player, boxes), optimal = found
                return Room(height, width, floor, targets, player, boxes, optimal)
            continue
        drawn = ragen_reverse_play(floor, width, num_boxes, rng, search_depth)
        if drawn is None:
            continue
        targets, player, boxes = drawn
        room = Room(height, width, floor, targets, player, boxes, optimal_steps=0)
        plan = solve(room)
        if plan is None or (max_solution_steps is not None and len(plan) > max_solution_steps):
            continue
        return Room(height, width, floor, targets, player, boxes, optimal_steps=len(plan))
    raise RuntimeError(
        f"no {height}x{width} room with {num_boxes} box(es) found for seed {seed} in {max_tries} tries; "
        "raise max_solution_steps or search_depth, or use fewer boxes"
    )


def step_state(state: State, move: tuple[int, int], floor: frozenset[int], width: int) -> State | None:
    """The state after one forward move, or None when the move is blocked (wall, or a box that cannot move)."""
    player, boxes = state
    offset = move[0] * width + move[1]
    target = player + offset
    if target not in floor:
        return None
    if target in boxes:
        beyond = target + offset
        if beyond not in floor or beyond in boxes:
            return None
        return target, tuple(sorted([b for b in boxes if b != target] + [beyond]))
    return target, boxes


def solve(room: Room, state: State | None = None, max_depth: int = 300) -> list[str] | None:
    """A shortest action sequence solving ``room`` from ``state`` (default: its initial state), or None."""
    start: State = state if state is not None else (room.player, room.boxes)
    goal = tuple(sorted(room.targets))
    if start[1] == goal:
        return []
    parents: dict[State, tuple[State, str] | None] = {start: None}
    queue = deque([(start, 0)])
    while queue:
        current, depth = queue.popleft()
        if depth >= max_depth:
            continue
        for name, move in MOVES.items():
            successor = step_state(current, move, room.floor, room.width)
            if successor is None or successor in parents:
                continue
            parents[successor] = (current, name)
            if successor[1] == goal:
                return _path(parents, successor)
            queue.append((successor, depth + 1))
    return None


def optimal_first_moves(room: Room, state: State, max_depth: int = 300) -> list[str] | None:
    """Every move that starts a shortest solution of ``room`` from ``state``, in :data:`MOVES` order; ``[]`` when
    already solved, None when unsolvable within ``max_depth``. Breadth-first, level by level, carrying for every
    state the set of first moves that reach it at its shortest depth."""
    goal = tuple(sorted(room.targets))
    if state[1] == goal:
        return []
    first: dict[State, set[str]] = {}
    level: dict[State, set[str]] = {}
    for name, move in MOVES.items():
        successor = step_state(state, move, room.floor, room.width)
        if successor is not None and successor != state:
            level.setdefault(successor, set()).add(name)
    first.update(level)
    first[state] = set()
    for _ in range(max_depth):
        solved = [moves for node, moves in level.items() if node[1] == goal]
        if solved:
            names = set().union(*solved)
            return [name for name in MOVES if name in names]
        following: dict[State, set[str]] = {}
        for node, moves in level.items():
            for move in MOVES.values():
                successor = step_state(node, move, room.floor, room.width)
                if successor is None or (successor in first and successor not in following):
                    continue
                following.setdefault(successor, set()).update(moves)
        if not following:
            return None
        first.update(following)
        level = following
    return None


def _path(parents: dict[State, tuple[State, str] | None], end: State) -> list[str]:
    actions = []
    node = parents[end]
    while node is not None:
        previous, name = node
        actions.append(name)
        node = parents[previous]
    return actions[::-1]
