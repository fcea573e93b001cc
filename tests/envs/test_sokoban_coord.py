"""RAGEN-2's coordinate observation of Sokoban (``observation_format``; ``sokoban_coord`` is its CoordSokoban):
a room rendered by hand, and a port of RAGEN-2's coordinate render (ragen/env/sokoban/utils.py at 20daedc)."""

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.sokoban_rooms import Room

# ######
# #_O__#    target (1, 2)
# #PX_√#    player (2, 1), box (2, 2), a box on the target (2, 4)
# #____#
# ######
FLOOR = frozenset(r * 6 + c for r in (1, 2, 3) for c in (1, 2, 3, 4))
ROOM = Room(height=5, width=6, floor=FLOOR, targets=(8, 16), player=13, boxes=(14, 16), optimal_steps=5)
GRID = "######\n#_O__#\n#PX_\u221a#\n#____#\n######"


def _hand_env(observation_format: str):
    env = make_env("sokoban", dim_room=(5, 6), num_boxes=2, observation_format=observation_format)
    env.load_room(ROOM)
    return env


def test_coordinates_of_a_room_worked_by_hand():
    coords = (
        "Board size: 5 rows x 6 cols (zero-indexed).\n"
        "Targets: (1, 2), (2, 4)\nBoxes: (2, 2)\nBoxes on target: (2, 4)\nPlayer: (2, 1)"
    )
    assert _hand_env("grid").render() == GRID
    assert _hand_env("coord").render() == coords
    assert _hand_env("grid_coord").render() == "Coordinates: \n" + coords + "\nGrid Map: \n" + GRID
    env = _hand_env("grid_coord")
    env.step("Up")
    text = env.step("Right")[0]  # onto the free target: "Player on target", S in the grid; the targets stay listed
    assert text == (
        "Coordinates: \nBoard size: 5 rows x 6 cols (zero-indexed).\n"
        "Targets: (1, 2), (2, 4)\nBoxes: (2, 2)\nBoxes on target: (2, 4)\nPlayer on target: (1, 2)\n"
        "Grid Map: \n######\n#_S__#\n#_X_\u221a#\n#____#\n######"
    )


def test_sokoban_coord_is_coordsokoban_and_says_so_in_its_instruction():
    env = make_env("sokoban_coord")
    text, _ = env.reset(3)
    plain, _ = make_env("sokoban").reset(3)
    assert text.startswith("Coordinates: \nBoard size: 6 rows x 6 cols (zero-indexed).\n")
    assert text.endswith("\nGrid Map: \n" + plain)  # the same room as sokoban's, the grid after the coordinates
    assert "from the top-left corner (0, 0) to the bottom-right corner (5, 5)" in env.instruction()
    assert (
        "symbol grid" in env.instruction()
        and "symbol grid" not in make_env("sokoban_coord", observation_format="coord").instruction()
    )
    with pytest.raises(ValueError, match="observation_format"):
        make_env("sokoban", observation_format="image")


def _ragen_coordinates(room_state: np.ndarray, room_fixed: np.ndarray) -> str:
    """RAGEN-2's collect_entity_coordinates + format_coordinate_render (index origin 0), ported."""
    pairs = lambda a: [(int(r), int(c)) for r, c in a]  # noqa: E731
    coords = {
        "targets": pairs(np.argwhere(room_fixed == 2)),
        "boxes_on_target": pairs(np.argwhere(room_state == 3)),
        "boxes": pairs(np.argwhere(room_state == 4)),
    }
    players = pairs(np.argwhere(room_state == 5))
    coords["player"] = [p for p in players if room_fixed[p] != 2]
    coords["player_on_target"] = [p for p in players if room_fixed[p] == 2]
    lines = [f"Board size: {room_state.shape[0]} rows x {room_state.shape[1]} cols (zero-indexed)."]
    for key, label in [
        ("walls", "Walls"),
        ("targets", "Targets"),
        ("boxes", "Boxes"),
        ("boxes_on_target", "Boxes on target"),
        ("player", "Player"),
        ("player_on_target", "Player on target"),
    ]:
        if coords.get(key):
            lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in coords[key]))
    return "\n".join(lines)


def _gym_arrays(env) -> tuple[np.ndarray, np.ndarray]:
    """gym-sokoban's room_state / room_fixed of the env's current state (0 wall, 1 floor, 2 target, 3 box on target,
    4 box, 5 player)."""
    room, (player, boxes) = env.room, env.state
    fixed = np.zeros((room.height, room.width), dtype=int)
    for cell in room.floor:
        fixed[room.position(cell)] = 2 if cell in room.targets else 1
    state = fixed.copy()
    for box in boxes:
        state[room.position(box)] = 3 if box in room.targets else 4
    state[room.position(player)] = 5
    return state, fixed


@pytest.mark.parametrize("name", ["sokoban_coord", "sokoban_large"])
def test_coordinates_match_a_port_of_ragens_render_in_random_play(name):
    env, rng = make_env(name, observation_format="coord"), np.random.default_rng(0)
    for seed in range(30):
        text, _ = env.reset(seed)
        for _ in range(15):
            assert text == _ragen_coordinates(*_gym_arrays(env))
            text, _, terminated, truncated, _ = env.step(env.sample_action(rng))
            if terminated or truncated:
                break
