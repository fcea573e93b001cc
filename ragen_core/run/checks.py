"""A run's config, checked against the registries: the one way a config for a run is built.

``ragen_core.config`` validates plain data and imports none of the registries. The names a config gives of
registered things (environments, advantage estimators, policy losses, group filters, scripted policies) and the
rules that hang on what they are (a critic's batches for an estimator that takes values, a teacher for teacher_mix)
are checked here, after pydantic has validated the tree, by :func:`check_registered`. :func:`build_run_config` and
:func:`load_run_config` do both; every entry that builds a config for a run (the CLI, the flows, sweeps, findings)
goes through them, so a bad name fails at load time with the same one-line message, before any compute.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragen_core.algos import ADVANTAGES, POLICY_LOSSES, needs_critic
from ragen_core.algos.filters import check_filter_options
from ragen_core.config import ConfigError, RunConfig, build_config, load_config
from ragen_core.config.errors import config_error
from ragen_core.envs import TextEnv, make_env, registered_envs
from ragen_core.rollout.scripted import has_teacher, registered_scripted_policies


def build_run_config(tree: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """:func:`ragen_core.config.build_config` (a tree plus ``key.sub=value`` overrides, validated), then
    :func:`check_registered`; raise :class:`ConfigError`."""
    return check_registered(build_config(tree, overrides))


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """:func:`ragen_core.config.load_config` (a YAML file, or the defaults, plus overrides), then
    :func:`check_registered`; raise :class:`ConfigError`."""
    return check_registered(load_config(path, overrides))


def check_registered(config: RunConfig) -> RunConfig:
    """Return ``config`` when every name it gives is registered and fits; else raise the :class:`ConfigError` that
    names the key and the fix (worded as pydantic's errors are, at the section the check belongs to)."""
    checks: tuple[tuple[str, Callable[[RunConfig], None]], ...] = (
        ("algorithm", _check_filter),
        ("<root>", _check_registered_names),
        ("<root>", _check_critic_batches),
    )
    for location, check in checks:
        try:
            check(config)
        except ValueError as exc:
            raise config_error(location, str(exc)) from None
    return config


def _check_filter(config: RunConfig) -> None:
    """``algorithm.filter`` is a registered strategy or an alias, and the filter keys fit it."""
    algorithm = config.algorithm
    check_filter_options(
        algorithm.filter,
        algorithm.filter_ratio,
        algorithm.filter_metric,
        algorithm.filter_largest,
        algorithm.filter_top_p_mode,
    )


def _check_critic_batches(config: RunConfig) -> None:
    """An estimator that takes the critic's values gets a critic, whose mini-batch holds whole micro-batches."""
    critic_mini = config.critic.mini_batch_size or config.actor.mini_batch_size
    critic_micro = config.critic.micro_batch_size or config.actor.micro_batch_size
    if needs_critic(config.algorithm.adv_estimator) and critic_mini % critic_micro:
        raise ValueError(
            f"critic.mini_batch_size={critic_mini} must be a multiple of critic.micro_batch_size={critic_micro}"
        )


def _check_registered_names(config: RunConfig) -> None:
    """Names that refer to registries must exist there."""
    envs = registered_envs()
    for key, name in [("env.name", config.env.name)] + [("env.val_envs", n) for n in config.env.val_envs or []]:
        if name not in envs:
            raise ValueError(f"{key}: unknown environment {name!r}; registered: {', '.join(envs)}")
    for key, name, registry in (
        ("algorithm.adv_estimator", config.algorithm.adv_estimator, ADVANTAGES),
        ("algorithm.policy_loss", config.algorithm.policy_loss, POLICY_LOSSES),
    ):
        if name not in registry:
            raise ValueError(f"{key}: unknown name {name!r}; registered: {', '.join(registry.names())}")
    policies = registered_scripted_policies()
    for key, name in (
        ("rollout.scripted_policy", config.rollout.scripted_policy),
        ("bootstrap.policy", config.bootstrap.policy),
    ):
        if name not in policies:
            raise ValueError(f"{key}: unknown scripted policy {name!r}; registered: {', '.join(policies)}")
        if name == "describe_random":
            _check_describing_policy(config, key)
        if name == "teacher_mix":
            _check_teacher_policy(config, key)


def _check_teacher_policy(config: RunConfig, key: str) -> None:
    """``teacher_mix`` draws the teacher's moves: every env it plays must have a teacher."""
    for name in {config.env.name, *(config.env.val_envs or [])} if key.startswith("rollout") else {config.env.name}:
        if not has_teacher(make_env(name)):
            raise ValueError(
                f"{key}: teacher_mix draws the teacher's moves, and {name} has no teacher (frozen_lake and sokoban "
                "have one); use the random policy"
            )


def _check_describing_policy(config: RunConfig, key: str) -> None:
    """``describe_random`` writes the env's state descriptions as thinking: the env must have some, replies think."""
    env_type = type(make_env(config.env.name))
    if env_type.describe is TextEnv.describe:
        raise ValueError(
            f"{key}: describe_random writes the env's state descriptions, and {config.env.name} has none "
            "(frozen_lake has them); use the random policy"
        )
    if not config.rollout.enable_think:
        raise ValueError(f"{key}: describe_random writes its descriptions as thinking: set rollout.enable_think=true")


__all__ = ["ConfigError", "build_run_config", "check_registered", "load_run_config"]
