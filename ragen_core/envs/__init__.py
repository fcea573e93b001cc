"""Text environments and their registry. Importing this package imports every module in it, which registers the
environments each defines (``@register_env``): a new environment is one new module here, nothing else to edit.
The built-in ones: ``bandit``, ``bandit_test``, ``bandit_reversed``, ``sokoban``, ``sokoban_large``,
``sokoban_new_vocab``, ``sokoban_coord``, ``frozen_lake``, ``countdown``, ``sudoku``, ``sudoku_pr147_4x4``,
``sudoku_pr147_9x9``, ``game_2048``, ``rubikscube``, ``dataset`` (prompts from a file, the user's reward function)
and ``calculator`` (a tool env: :class:`ToolEnv`).
Environments of the user's own code are named ``package.module:Class``, or registered by an installed distribution
under the entry-point group ``ragen.envs`` (:mod:`ragen_core.envs.external`). Any of them can be served over HTTP
(:mod:`ragen_core.envs.serving`, ``ragen env serve``) and played from there (:mod:`ragen_core.envs.remote`,
``env.remote``)."""

import importlib
import pkgutil

from ragen_core.envs.base import TextEnv, available_envs, env_factory, make_env, register_env, registered_envs
from ragen_core.envs.tool_env import ToolEnv, tool

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")  # registers its environments

__all__ = [
    "TextEnv",
    "ToolEnv",
    "available_envs",
    "env_factory",
    "make_env",
    "register_env",
    "registered_envs",
    "tool",
]
