"""An env's state drawn as a board from the env's own legend (``TextEnv.grid_legend``), with no edit of the viewer:
a grid env planted here (a class of this test, registered here) draws its board in its own tiles and colours; the
same rows without the registration, or under an env of the user's own code (which the viewer never imports), are
shown as text."""

from __future__ import annotations

import dataclasses
import html
import re
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ragen_core.envs import base as env_base
from ragen_core.envs.base import StepResult, TextEnv, Tile, legend_symbols, register_env
from ragen_core.storage import DataLake
from ragen_view import render
from ragen_view.app import create_app
from tests.storage.synthetic import Trajectory, make_run, write_run

PLANTED_ENV = "planted_lava_view"
USER_ENV = "planted_view_user_env:LavaEnv"  # an import path: the user's own code
BOARD = "~~..\n.@.~\n...."
FINAL = "~~..\n..~@\n...."
LEGEND = (
    Tile("~", "lava", "#ff4500", "lava"),
    Tile(".", "rock", "#44403c", "cold rock"),
    Tile("@", "walker", "#facc15", "you"),
)


class LavaEnv(TextEnv):
    """A grid env of this test alone: nothing in the viewer names it."""

    grid_legend = LEGEND
    grid_symbols = legend_symbols(LEGEND)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return BOARD, {"success": False}

    def step(self, action: str) -> StepResult:
        return FINAL, 0.0, True, False, {"success": False, "action_is_valid": True, "action_is_effective": True}

    def render(self) -> str:
        return BOARD

    @property
    def action_names(self) -> list[str]:
        return ["Up", "Down", "Left", "Right"]

    def instruction(self) -> str:
        return "Cross the lava."

    @property
    def success(self) -> bool:
        return False


@dataclasses.dataclass
class OnLava(Trajectory):
    """A synthetic trajectory whose turns observe the board, and which stores the board it ended on."""

    def turn_rows(self) -> list[dict[str, Any]]:
        return [
            {**row, "observation": f"Turn {row['turn_index']}. State:\n{BOARD}\nWhere now?"}
            for row in super().turn_rows()
        ]

    def row(self) -> dict[str, Any]:
        return {**super().row(), "end_reason": "failure", "final_state": FINAL}


def _lake(root, run_id: str, env: str) -> DataLake:
    lake = DataLake(root)
    run = make_run(3, run_id, env, iterations=1, groups=1, group_size=2)
    run.trajectories = [  # one turn each: the reply the token view cuts out is the turn's row (its observation)
        OnLava(**{**{f.name: getattr(t, f.name) for f in dataclasses.fields(t)}, "turns": t.turns[:1]})
        for t in run.trajectories
    ]
    write_run(lake, run)
    return lake


def _page(lake: DataLake, run_id: str, env: str) -> str:
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    answer = client.get(
        f"/runs/{run_id}/iterations/0/trajectory", params={"split": "train", "env": env, "group": 0, "traj": 0}
    )
    assert answer.status_code == 200, answer.text[-2000:]
    return answer.text


def _cells(page: str) -> list[tuple[str, str, str, str, str]]:
    """(name, title, fill, ink, symbol) of every drawn tile of the page, in order."""
    return re.findall(
        r'<td class="tile ([a-z0-9-]+)" title="([^"]*)"><svg[^>]*><rect[^>]* fill="([^"]+)"></rect>'
        r'<text[^>]* fill="([^"]+)">([^<]*)</text></svg></td>',
        page,
    )


@pytest.fixture
def planted_env():
    register_env(PLANTED_ENV)(LavaEnv)
    yield PLANTED_ENV
    env_base._REGISTRY.remove(PLANTED_ENV)


def test_a_planted_grid_env_draws_its_board_from_its_legend(tmp_path, planted_env):
    lake = _lake(tmp_path, "lava", planted_env)
    page = _page(lake, "lava", planted_env)
    cells = _cells(page)
    boards = [cells[i : i + 12] for i in range(0, len(cells), 12)]
    assert len(boards) == 2, "the turn's board, and the final state's"
    first = [(name, fill, symbol) for name, _, fill, _, symbol in boards[0]]
    assert first[:5] == [
        ("lava", "#ff4500", "~"),
        ("lava", "#ff4500", "~"),
        ("rock", "#44403c", "."),
        ("rock", "#44403c", "."),
        ("rock", "#44403c", "."),
    ]
    assert first[5] == ("walker", "#facc15", "@")
    by_name = {name: (title, ink) for name, title, _, ink, _ in cells}
    assert by_name == {  # the legend's words as tooltips; ink readable on each colour (white on dark, dark on light)
        "lava": ("~: lava", "#111111"),
        "rock": (".: cold rock", "#ffffff"),
        "walker": ("@: you", "#111111"),
    }
    assert "".join(symbol for *_, symbol in boards[-1]) == FINAL.replace("\n", "") and 'id="final-board"' in page
    assert f'<pre id="final-state">{html.escape(FINAL)}</pre>' in page  # the text stays beside the board


def test_without_its_legend_the_state_is_text(tmp_path, planted_env):
    lake = _lake(tmp_path, "lava", planted_env)
    env_base._REGISTRY.remove(planted_env)
    try:
        page = _page(lake, "lava", planted_env)
    finally:
        register_env(planted_env)(LavaEnv)
    assert '<table class="grid">' not in page and _cells(page) == []
    assert html.escape(BOARD) in page  # the observation, as text


def test_a_users_own_env_is_never_imported_to_draw_it(tmp_path, monkeypatch):
    """An env named by import path is the user's code: the viewer shows its states as text and imports nothing of it
    (docs/security.md), even where the module is on the path and would draw a board."""
    flag = tmp_path / "imported"
    module = tmp_path / "code" / "planted_view_user_env.py"
    module.parent.mkdir()
    module.write_text(
        f"from pathlib import Path\nPath({str(flag)!r}).write_text('imported')\n"
        "from tests.view.test_boards import LavaEnv\n"
    )
    monkeypatch.syspath_prepend(str(module.parent))
    assert render.legend_of(USER_ENV) == ()
    page = _page(_lake(tmp_path / "lake", "user", USER_ENV), "user", USER_ENV)
    assert _cells(page) == [] and html.escape(BOARD) in page
    assert not flag.exists() and "planted_view_user_env" not in sys.modules
