"""Every number an env takes as an option is bounded on both sides (issue 39, item 3): the bound itself is accepted,
one past it refused with a ValueError naming the option; booleans, nan and infinities are refused as numbers."""

from __future__ import annotations

import math
import re

import pytest

from ragen_core.envs import make_env
from ragen_core.envs.base import bounded

# (env, option, largest accepted value, smallest refused value above it): the bounds as each module declares them
UPPER = [
    ("sokoban", "num_boxes", 3, 4),
    ("sokoban", "search_depth", 300, 301),
    ("sokoban", "max_steps", 10_000, 10_001),
    ("sokoban", "num_gen_steps", 1_000, 1_001),
    ("frozen_lake", "size", 32, 33),
    ("countdown", "max_target", 1_000_000, 1_000_001),
    ("game_2048", "target", 2**15, 2**16),
    ("rubikscube", "scramble_depth", 1_000, 1_001),
    ("sudoku", "max_steps", 10_000, 10_001),
    ("sudoku_pr147_4x4", "max_steps", 10_000, 10_001),
    ("bandit", "low_reward", 1e6, 1e6 + 1),
    ("sudoku", "completion_bonus", 1e6, 2e6),
]


@pytest.mark.parametrize(("name", "option", "largest", "refused"), UPPER, ids=[f"{c[0]}.{c[1]}" for c in UPPER])
def test_the_bound_is_accepted_and_one_past_it_refused(name, option, largest, refused):
    assert make_env(name, **{option: largest}).name == name
    with pytest.raises(ValueError, match=rf"^{re.escape(option)}\b.* from .* to "):
        make_env(name, **{option: refused})


def test_a_sokoban_room_side_past_the_bound_is_refused_before_any_room_is_built():
    env = make_env("sokoban", dim_room=[16, 16])
    assert (env.height, env.width) == (16, 16)
    for room in ([17, 6], [6, 1_000_000_000], [3, 6], [6], "66", [6.0, 6]):
        with pytest.raises(ValueError, match="dim_room"):
            make_env("sokoban", dim_room=room)


def test_a_frozen_lake_map_larger_than_the_bound_is_refused():
    row = "S" + "F" * 31
    assert make_env("frozen_lake", desc=[row] + ["F" * 31 + "G"]).desc[0] == row
    with pytest.raises(ValueError, match="row length must be a whole number from 1 to 32, got 33"):
        make_env("frozen_lake", desc=["S" + "F" * 32, "F" * 32 + "G"])
    with pytest.raises(ValueError, match="number of rows must be a whole number from 1 to 32, got 33"):
        make_env("frozen_lake", desc=["SG"] + ["FF"] * 32)


@pytest.mark.parametrize("value", [True, math.nan, math.inf, -math.inf, "3", None, 10**400])
def test_bounded_refuses_what_is_not_a_number_in_range(value):
    with pytest.raises(ValueError, match="^x must be a "):
        bounded("x", value, 0, 10, integer=False)
    with pytest.raises(ValueError, match="^x must be a whole number"):
        bounded("x", value, 0, 10)


def test_bounded_keeps_the_value_and_its_type():
    assert bounded("x", 10, 0, 10) == 10 and bounded("x", 0, 0, 10) == 0
    assert bounded("x", 2, 0.0, 2.5, integer=False) == 2 and bounded("x", 2.5, 0.0, 2.5, integer=False) == 2.5
    with pytest.raises(ValueError, match="whole number"):
        bounded("x", 2.0, 0, 10)  # a whole-number option is given a whole number
