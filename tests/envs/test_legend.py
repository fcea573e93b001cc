"""How an env's grid state is drawn (``TextEnv.grid_legend``): one tile per kind of cell, the symbols the tokenizer
keeps apart (``grid_symbols``) and the words the prompt states them in, declared once on the env."""

from __future__ import annotations

import re

import pytest

from ragen_core.envs import make_env, registered_envs
from ragen_core.envs.base import Tile, legend_symbols, legend_text
from ragen_core.envs.sokoban import NEW_VOCAB_SYMBOLS
from tests.envs.test_protocol import ENV_OPTIONS


@pytest.mark.parametrize("name", registered_envs())
def test_a_legend_declares_each_symbol_once_and_is_the_tokenizers_symbols(name):
    env = make_env(name, **ENV_OPTIONS.get(name, {}))
    legend = env.grid_legend
    if not legend:
        return
    symbols = [tile.symbol for tile in legend]
    assert len(set(symbols)) == len(symbols), f"{name}: a symbol drawn twice"
    assert len({tile.name for tile in legend}) == len(legend), f"{name}: two kinds of cell under one name"
    assert legend_symbols(legend) == env.grid_symbols, f"{name}: its grid_symbols are not its legend's"


def test_the_grid_envs_draw_their_boards():
    assert {name for name in registered_envs() if make_env(name, **ENV_OPTIONS.get(name, {})).grid_legend} == {
        "frozen_lake",
        "sokoban",
        "sokoban_coord",
        "sokoban_large",
        "sokoban_new_vocab",
    }
    sokoban = make_env("sokoban")
    assert [(t.symbol, t.name) for t in sokoban.grid_legend[:3]] == [("#", "wall"), ("_", "floor"), ("O", "target")]
    assert make_env("sokoban_new_vocab").grid_legend == NEW_VOCAB_SYMBOLS.tiles()
    assert make_env("sokoban_new_vocab").grid_legend[3] == Tile("B", "box", "#b45309", "box")


def test_the_prompts_state_the_legends_words():
    """The legend the model reads is the one the viewer draws: the prompts' symbol lines, as they were written out
    before the legend was declared (a changed word changes the prompts, so the numbers: it must be on purpose)."""
    frozen = "P: you, _: frozen ice, O: hole, G: goal, X: you in a hole, \u221a: you on the goal"
    assert legend_text(make_env("frozen_lake").grid_legend) == frozen
    assert f"The symbols of the state are: {frozen}." in make_env("frozen_lake").instruction()
    sokoban = (
        "#: wall, _: empty floor, O: target, X: box, \u221a: box on target, P: you (the player), "
        "S: you standing on a target"
    )
    env = make_env("sokoban")
    env.reset(0)
    assert legend_text(env.grid_legend) == sokoban and f"The symbols of the state are: {sokoban}." in env.instruction()


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (("##", "wall", "#000000", "wall"), "one visible character"),
        ((" ", "gap", "#000000", "gap"), "one visible character"),
        (("#", "Wall", "#000000", "wall"), "lower-case word"),
        (("#", "wall tile", "#000000", "wall"), "lower-case word"),
        (("#", "wall", "black", "wall"), "#rrggbb"),
        (("#", "wall", '#000000" onload="x', "wall"), "#rrggbb"),
    ],
)
def test_a_tile_refuses_what_cannot_be_drawn(fields, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        Tile(*fields)
