"""Text environments and their registry. Importing this package registers every built-in environment."""

from ragen_core.envs import bandit  # noqa: F401  (registers the bandit family)
from ragen_core.envs.base import TextEnv, make_env, register_env, registered_envs

__all__ = ["TextEnv", "make_env", "register_env", "registered_envs"]
