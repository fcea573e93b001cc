"""Text environments and their registry. Importing this package registers every built-in environment:
``bandit``, ``bandit_test``, ``bandit_reversed``, ``sokoban``, ``sokoban_large``, ``sokoban_new_vocab``,
``frozen_lake`` and ``countdown``."""

from ragen_core.envs import bandit, countdown, frozen_lake, sokoban  # noqa: F401  (register the environments)
from ragen_core.envs.base import TextEnv, make_env, register_env, registered_envs

__all__ = ["TextEnv", "make_env", "register_env", "registered_envs"]
