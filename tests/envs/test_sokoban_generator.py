"""RAGEN's Sokoban generator against independent checks of its rules: reverse moves undo forward moves, the reported
optimal length is a breadth-first search's, and the depth-first scoring picks the state worked out by hand."""

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_core.envs import make_env
from ragen_core.envs.sokoban_rooms import (
    MOVES,
    _DepthFirstReversePlay,
    carve_topology,
    generate_room,
    step_state,
)

OPPOSITE = {"Up": "Down", "Down": "Up", "Left": "Right", "Right": "Left"}


def _grid(text: str) -> tuple[set, set, set, tuple[int, int]]:
    """(floor, targets, boxes, player) read from a classic rendering, as (row, col) cells."""
    floor, targets, boxes, player = set(), set(), set(), None
    for r, line in enumerate(text.split("\n")):
        for c, ch in enumerate(line):
            if ch != "#":
                floor.add((r, c))
            if ch in "O\u221aS":
                targets.add((r, c))
            if ch in "X\u221a":
                boxes.add((r, c))
            if ch in "PS":
                player = (r, c)
    return floor, targets, boxes, player


def _bfs_length(text: str) -> int | None:
    """Shortest push-solution length of a rendered room, by a search written independently of the env."""
    floor, targets, boxes, player = _grid(text)
    start = (player, frozenset(boxes))
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (p, bs), depth = queue.popleft()
        if bs == targets:
            return depth
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            q = (p[0] + dr, p[1] + dc)
            if q not in floor:
                continue
            nbs = bs
            if q in bs:
                beyond = (q[0] + dr, q[1] + dc)
                if beyond not in floor or beyond in bs:
                    continue
                nbs = (bs - {q}) | {beyond}
            state = (q, nbs)
            if state not in seen:
                seen.add(state)
                queue.append((state, depth + 1))
    return None


@pytest.mark.parametrize(("name", "seeds"), [("sokoban", 150), ("sokoban_large", 60), ("sokoban_new_vocab", 20)])
def test_reported_optimal_length_is_the_breadth_first_length(name, seeds):
    env, classic = make_env(name), make_env("sokoban" if name != "sokoban_large" else name)
    if name == "sokoban_new_vocab":
        classic = make_env("sokoban", search_depth=30)
    for seed in range(seeds):
        _, info = env.reset(seed)
        text, _ = classic.reset(seed)
        _, targets, boxes, _ = _grid(text)
        assert not boxes & targets  # every box starts off the targets
        assert _bfs_length(text) == info["optimal_steps"] >= 1


def _pull(state, name, floor, width):
    """RAGEN's reverse move: walk one cell, pulling the box behind the player if there is one (None if blocked)."""
    player, boxes = state
    d_row, d_col = MOVES[name]
    offset = d_row * width + d_col
    step = player + offset
    if step not in floor or step in boxes:
        return None
    behind = player - offset
    if behind in boxes:
        return step, tuple(sorted([b for b in boxes if b != behind] + [player]))
    return step, boxes


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), moves=st.lists(st.sampled_from(list(MOVES)), min_size=1, max_size=30))
def test_reverse_moves_are_exact_inverses_of_forward_moves(seed, moves):
    rng = np.random.default_rng(seed)
    floor = carve_topology(rng, 7, 7, 0.35, 25)
    cells = sorted(floor)
    if len(cells) < 4:
        return
    picks = [cells[int(i)] for i in rng.choice(len(cells), 3, replace=False)]
    state = (picks[0], tuple(sorted(picks[1:])))
    for name in moves:
        pulled = _pull(state, name, floor, 7)
        if pulled is None:
            continue
        # The forward move opposite to the reverse move brings back exactly the state before it.
        assert step_state(pulled, MOVES[OPPOSITE[name]], floor, 7) == state
        state = pulled


def _corridor():
    # Row 1 of a 7-wide room: cells 8..12 are floor (c0..c4); the box starts on its target c1 = 9, the player on
    # c2 = 10. Reverse play can only walk right pulling the box: (11, box 10) scores 1 swap x 1 = 1, then
    # (12, box 11) scores 1 x 2 = 2; nothing else is reachable (walking left is blocked by the box or the wall).
    return frozenset({8, 9, 10, 11, 12}), (9,)


def test_depth_first_reverse_play_keeps_the_best_state_worked_out_by_hand():
    floor, targets = _corridor()
    play = _DepthFirstReversePlay(floor, targets, 7, max_states=300_000)
    play.search(10, targets, (False,), swaps=0, last=-1, ttl=300)
    assert (play.best_score, play.best) == (2, (12, (11,)))


@pytest.mark.parametrize(("depth", "expected"), [(2, (0, (10, (9,)))), (3, (1, (11, (10,)))), (4, (2, (12, (11,))))])
def test_search_depth_counts_reverse_moves_as_ragen_does(depth, expected):
    # RAGEN decrements the depth budget before looking at a state and stops at zero: depth d explores d - 1 levels.
    floor, targets = _corridor()
    play = _DepthFirstReversePlay(floor, targets, 7, max_states=300_000)
    play.search(10, targets, (False,), swaps=0, last=-1, ttl=depth)
    assert (play.best_score, play.best) == expected


def test_score_is_swaps_times_displacement_and_zero_while_a_target_is_covered():
    play = _DepthFirstReversePlay(frozenset(range(8, 13)) | frozenset(range(15, 20)), (9, 16), 7, max_states=10)
    # Boxes that started on targets 9 and 16 now on 11 (2 away) and 19 (3 away): displacement 5.
    assert play.displacement((11, 19)) == 5
    assert play.score(12, (11, 19), swaps=3) == 15
    assert play.score(9, (11, 19), swaps=3) == 0  # the player stands on a target
    assert play.score(12, (16, 19), swaps=3) == 0  # a box is on a target


def test_generators_are_deterministic_and_the_bfs_option_stays_available():
    ragen = generate_room(11)
    assert generate_room.__wrapped__(11) == ragen  # the cache returns what a fresh generation gives
    bfs = make_env("sokoban", generator="bfs", num_gen_steps=25)
    text, info = bfs.reset(11)
    assert _bfs_length(text) == info["optimal_steps"]
    with pytest.raises(ValueError, match="generator"):
        make_env("sokoban", generator="dfs")
