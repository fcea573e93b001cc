"""Text environments and their registry. Importing this package registers every built-in environment:
``bandit``, ``bandit_test``, ``bandit_reversed``, ``sokoban``, ``sokoban_large``, ``sokoban_new_vocab``,
``sokoban_coord``, ``frozen_lake``, ``countdown``, ``sudoku``, ``sudoku_pr147_4x4``, ``sudoku_pr147_9x9``,
``game_2048`` and ``rubikscube``."""

from ragen_core.envs import (  # noqa: F401  (register the environments)
    bandit,
    countdown,
    frozen_lake,
    game_2048,
    rubikscube,
    sokoban,
    sudoku,
    sudoku_pr147,
)
from ragen_core.envs.base import TextEnv, make_env, register_env, registered_envs

__all__ = ["TextEnv", "make_env", "register_env", "registered_envs"]
