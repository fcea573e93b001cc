"""A run's config, checked against the registries: the one way a config for a run is built.

``ragen_core.config`` validates plain data and imports none of the registries. The names a config gives of
registered things (environments, advantage estimators, policy losses, group filters, scripted policies, trackers and
their packages) and the rules that hang on what they are (a critic's batches for an estimator that takes values, a
teacher for teacher_mix) are checked here, after pydantic has validated the tree, by :func:`check_registered`.
:func:`build_run_config` and :func:`load_run_config` do both; every entry that builds a config for a run (the CLI,
the flows, sweeps, findings) goes through them, so a bad name fails at load time with the same one-line message,
before any compute. Loading a config reaches nothing outside the process: what it names there (the server of
``env.remote``, the MCP server program of ``env.mcp``) is asked by :func:`check_run_start` when a run starts.

A config read back from the data root (a run's manifest, a stored sweep plan) is built by
:func:`build_stored_run_config`, which also refuses a stored value of a key that names a program, a module, hosts or
a folder outside the data root unless the user names it again (:mod:`ragen_core.config.trust`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragen_core.algos import ADVANTAGES, POLICY_LOSSES, needs_critic
from ragen_core.algos.filters import check_filter_options
from ragen_core.config import ConfigError, RunConfig, build_config, load_config, stored_config
from ragen_core.config.errors import config_error
from ragen_core.config.trust import StoredConfig, UntrustedConfigError, check_stored_trust, named_keys
from ragen_core.envs import TextEnv, env_factory, make_env
from ragen_core.envs.dataset import DatasetEnv
from ragen_core.envs.external import metric_env_name
from ragen_core.envs.mcp_tools import McpServerError, mcp_server
from ragen_core.envs.remote import RemoteEnvError, open_env, served_env
from ragen_core.envs.tool_env import ToolEnv, is_tool_env
from ragen_core.monitor.trackers import check_trackers
from ragen_core.rollout.samplers import BACKENDS
from ragen_core.rollout.scripted import has_teacher, registered_scripted_policies
from ragen_core.run.schedule import Schedule
from ragen_core.run.stages import ITERATION
from ragen_core.storage import DataLake
from ragen_core.storage.layout import manifest_file
from ragen_core.tools import TOOL_PARSERS


def build_run_config(tree: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """:func:`ragen_core.config.build_config` (a tree plus ``key.sub=value`` overrides, validated), then
    :func:`check_registered`; raise :class:`ConfigError`."""
    return check_registered(build_config(tree, overrides))


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """:func:`ragen_core.config.load_config` (a YAML file, or the defaults, plus overrides), then
    :func:`check_registered`; raise :class:`ConfigError`."""
    return check_registered(load_config(path, overrides))


def build_stored_run_config(
    stored: StoredConfig,
    overrides: list[str] | None = None,
    trusted_kinds: frozenset[str] = frozenset(),
    unused: frozenset[str] = frozenset(),
) -> RunConfig:
    """The config of a tree read from the data root (``stored``, with the keys it predates filled in as the run
    behaved: :func:`ragen_core.config.stored_config`) plus the user's ``key.sub=value`` overrides, as
    :func:`build_run_config`; then :func:`ragen_core.config.trust.check_stored_trust`: a program, module, host or
    outside folder the file names and the user did not is refused (:class:`UntrustedConfigError`), except the kinds
    of ``trusted_kinds`` (``{"module"}``: the user's ``--trust-env-module``) and the keys the caller never uses
    (``unused``: dotted, e.g. a chat built from the env section alone uses no ``model.path``). The trust check comes
    first: a module a refused file names is never imported."""
    overrides = list(overrides or [])
    config = build_config(stored_config(stored.tree), overrides)
    check_stored_trust(config, stored, named_keys(overrides) | unused, trusted_kinds)  # before any name is looked up
    return check_registered(config)  # (which imports the modules of the environments it names)


def stored_trust_refusals(
    stored: StoredConfig, trusted_kinds: frozenset[str] = frozenset(), unused: frozenset[str] = frozenset()
) -> list[UntrustedConfigError]:
    """Every refusal :func:`build_stored_run_config` would meet, one per key (the check stops at the first; asked
    again with that key set aside, it names the next), found without importing or reading anything ``stored``
    names: for a message that says at once all the user has to allow."""
    config, refused = build_config(stored_config(stored.tree)), []
    while True:
        try:
            check_stored_trust(config, stored, set(unused) | {exc.key for exc in refused}, trusted_kinds)
            return refused
        except UntrustedConfigError as exc:
            refused.append(exc)


def manifest_config(lake: DataLake, run_id: str, tree: dict[str, Any]) -> StoredConfig:
    """Run ``run_id``'s config ``tree`` as its manifest holds it: a config read from the data root, named by the
    manifest's path under the root (for :func:`build_stored_run_config`)."""
    return StoredConfig(tree, str(manifest_file(lake.run_dir(run_id)).relative_to(lake.root)), lake.root)


def check_registered(config: RunConfig) -> RunConfig:
    """Return ``config`` when every name it gives is registered and fits; else raise the :class:`ConfigError` that
    names the key and the fix (worded as pydantic's errors are, at the section the check belongs to)."""
    checks: tuple[tuple[str, Callable[[RunConfig], None]], ...] = (
        ("algorithm", _check_filter),
        ("<root>", _check_envs),
        ("env", _check_env_options),  # before the checks below build envs with the options
        ("<root>", _check_registered_names),
        ("<root>", _check_critic_batches),
        ("<root>", _check_tools),
        ("<root>", _check_schedule),
    )
    return _checked(config, checks)


def check_run_start(config: RunConfig) -> RunConfig:
    """Return ``config`` when what it names outside this process answers: the server of ``env.remote`` serves the
    run's env (and has what a scripted policy asks of it), the MCP server of ``env.mcp`` starts and lists its tools
    (the process keeps it for the run). Asked when a run starts (train, resume, eval, retrain: the request builders
    of :mod:`ragen_core.run.requests`), before any compute, never when a config is only loaded (``ragen config
    show``, a sweep's plan): loading a config starts nothing and asks no server. Else the :class:`ConfigError`."""
    checks: tuple[tuple[str, Callable[[RunConfig], None]], ...] = (
        ("<root>", _check_remote_env),
        ("<root>", _check_mcp),
        ("<root>", lambda checked: _check_scripted_policies(checked, remote=True)),
        ("model", _check_adapter),
    )
    return _checked(config, checks)


def _check_adapter(config: RunConfig) -> None:
    """``model.adapter`` names a LoRA adapter folder whose files read (its settings and weights), before any
    model loads: a wrong folder is one line, not a failed run."""
    if config.model.adapter is not None:
        from ragen_core.policy.lora import read_adapter

        read_adapter(Path(config.model.adapter).expanduser())


def _checked(config: RunConfig, checks: tuple[tuple[str, Callable[[RunConfig], None]], ...]) -> RunConfig:
    """``config`` once each check passed; the first ValueError as the :class:`ConfigError` at its location."""
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


def _check_schedule(config: RunConfig) -> None:
    """An async run turns on no stage of the iteration that only a synchronous run can run (the rows that say why:
    :meth:`ragen_core.run.schedule.Schedule.refusals`)."""
    refusals = Schedule.of(config).refusals(config, ITERATION)
    if refusals:
        raise ValueError(refusals[0])


def _check_critic_batches(config: RunConfig) -> None:
    """An estimator that takes the critic's values gets a critic, whose mini-batch holds whole micro-batches."""
    critic_mini = config.critic.mini_batch_size or config.actor.mini_batch_size
    critic_micro = config.critic.micro_batch_size or config.actor.micro_batch_size
    if needs_critic(config.algorithm.adv_estimator) and critic_mini % critic_micro:
        raise ValueError(
            f"critic.mini_batch_size={critic_mini} must be a multiple of critic.micro_batch_size={critic_micro}"
        )


def _check_registered_names(config: RunConfig) -> None:
    """Names that refer to registries must exist there (a tracker's package too)."""
    check_trackers(config.monitor.trackers)
    for key, name, registry in (
        ("algorithm.adv_estimator", config.algorithm.adv_estimator, ADVANTAGES),
        ("algorithm.policy_loss", config.algorithm.policy_loss, POLICY_LOSSES),
        ("rollout.backend", config.rollout.backend, BACKENDS),
    ):
        if name not in registry:
            raise ValueError(f"{key}: unknown name {name!r}; registered: {', '.join(registry.names())}")
    policies = registered_scripted_policies()
    for key, name in _scripted_policies(config):
        if name not in policies:
            raise ValueError(f"{key}: unknown scripted policy {name!r}; registered: {', '.join(policies)}")
    _check_scripted_policies(config, remote=False)


def _scripted_policies(config: RunConfig) -> tuple[tuple[str, str], ...]:
    return (("rollout.scripted_policy", config.rollout.scripted_policy), ("bootstrap.policy", config.bootstrap.policy))


def _check_scripted_policies(config: RunConfig, remote: bool) -> None:
    """The envs a scripted policy plays have what it draws: those played here (``remote`` False, when the config is
    loaded) or those a server plays (``remote`` True, asked of the server when the run starts)."""
    for key, name in _scripted_policies(config):
        if name == "describe_random":
            _check_describing_policy(config, key, remote)
        if name == "teacher_mix":
            _check_teacher_policy(config, key, remote)


def _check_envs(config: RunConfig) -> None:
    """Every env the config names (``env.name``, ``env.val_envs``) is registered here, by an installed distribution or
    an importable ``package.module:Class`` implementing the TextEnv protocol: a missing module or a class that is no
    env is one line before any compute (its options are :func:`_check_env_options`'s); two validation envs whose
    metric names (:func:`~ragen_core.envs.external.metric_env_name`) are one are refused."""
    for key, name in [("env.name", config.env.name)] + [("env.val_envs", n) for n in config.env.val_envs or []]:
        if config.env.remote_for(name) is None:  # an env played on a server is the server's to build
            env_factory(name, key)
    named: dict[str, str] = {}
    for name in config.env.validation_envs:
        other = named.setdefault(metric_env_name(name), name)
        if other != name:
            raise ValueError(
                f"env.val_envs: {other} and {name} would share the metric names val/{metric_env_name(name)}/*: "
                "validate on one of them, or give one class another name"
            )


def _check_remote_env(config: RunConfig) -> None:
    """``env.remote`` serves env.name with env.options: asked of the server (``GET /ragen/env``) when the run starts,
    before any compute, so a server that is down or serves another env is one line, nothing started."""
    if config.env.remote is None:
        return
    try:  # asked now, not from what this process heard before (a Python API or a worker runs many runs)
        served_env(config.env.remote, config.env.user_code_timeout_s, fresh=True)
        open_env(config.env.name, dict(config.env.options), config.env.remote, config.env.user_code_timeout_s)
    except RemoteEnvError as exc:
        raise ValueError(f"env.remote: {exc}") from None


def _check_env_options(config: RunConfig) -> None:
    """``env.options`` builds every env the run plays (training and validation: each gets the options), so an option
    an env does not take, or a number out of its bounds (a board side of 1e9), is said here, before any compute; the
    dataset env's reward function scores its first rows' reference answers (:meth:`DatasetEnv.check_reward`)."""
    options = dict(config.env.options)
    for name in dict.fromkeys([config.env.name, *(config.env.val_envs or [])]):
        if config.env.remote_for(name) is not None:  # the server built it with its options (check_run_start)
            continue
        try:
            env = make_env(name, **options)
            if isinstance(env, DatasetEnv):  # its reward function scores the first rows' answers here
                env.check_reward(timeout_s=config.env.user_code_timeout_s)
        except ValueError as exc:  # an error that names its key (env.options.reward_fn: ...) needs no prefix
            raise ValueError(str(exc) if str(exc).startswith("env.options.") else f"options: {exc}") from None


def _check_mcp(config: RunConfig) -> None:
    """``env.mcp`` gives its tools to a tool env (played in this process: the config refuses it beside env.remote),
    and its server starts and lists its tools (the process keeps it for the run): a server that cannot start is one
    line before any compute."""
    if config.env.mcp is None:
        return
    if not is_tool_env(make_env(config.env.name, **config.env.options)):
        raise ValueError(
            f"env.mcp gives its tools to a tool env's agent, and {config.env.name} acts by no tool calls (calculator "
            "does; docs/environments.md, 'Tool environments')"
        )
    try:
        mcp_server(config.env.mcp, config.env.user_code_timeout_s)
    except McpServerError as exc:
        raise ValueError(str(exc)) from None


def _check_tools(config: RunConfig) -> None:
    """``rollout.tool_parser`` is a registered parser, each tool env the run plays has tools a schema can state
    (their names and signatures: :meth:`~ragen_core.envs.ToolEnv.tools`), and it is played with its whole chat (a
    windowed context would re-render it: the replies' tokens would not be the sampled ones)."""
    if config.rollout.tool_parser not in TOOL_PARSERS:
        names = ", ".join(TOOL_PARSERS.names())
        raise ValueError(
            f"rollout.tool_parser: unknown tool-call parser {config.rollout.tool_parser!r}; registered: {names}"
        )
    mode = config.rollout.context_window_mode
    for name in dict.fromkeys([config.env.name, *(config.env.val_envs or [])]):
        if config.env.remote_for(name) is not None:  # a served env is never a tool env (the server refuses those)
            continue
        factory = env_factory(name)
        if not (isinstance(factory, type) and issubclass(factory, ToolEnv)):  # other envs: nothing built here
            continue
        make_env(name, **config.env.options).tools()  # a ValueError of one line for a tool no schema can state
        if mode != "full":
            raise ValueError(
                f"rollout.context_window_mode={mode}: {name} is a tool env, played with its whole chat (a window "
                "would re-render it instead of the sampled tokens): use full"
            )


def _check_teacher_policy(config: RunConfig, key: str, remote: bool) -> None:
    """``teacher_mix`` draws the teacher's moves: every env it plays (here, or on a server: ``remote``) must have a
    teacher."""
    for name in {config.env.name, *(config.env.val_envs or [])} if key.startswith("rollout") else {config.env.name}:
        if (config.env.remote_for(name) is not None) != remote:
            continue
        if not has_teacher(_env(config, name)):
            raise ValueError(
                f"{key}: teacher_mix draws the teacher's moves, and {name} has no teacher (frozen_lake and sokoban "
                "have one); use the random policy"
            )


def _check_describing_policy(config: RunConfig, key: str, remote: bool) -> None:
    """``describe_random`` writes the env's state descriptions as thinking: the env (here, or on a server:
    ``remote``) must have some, replies think."""
    if (config.env.remote_for(config.env.name) is not None) == remote:
        if type(_env(config, config.env.name)).describe is TextEnv.describe:
            raise ValueError(
                f"{key}: describe_random writes the env's state descriptions, and {config.env.name} has none "
                "(frozen_lake has them); use the random policy"
            )
    if not remote and not config.rollout.enable_think:
        raise ValueError(f"{key}: describe_random writes its descriptions as thinking: set rollout.enable_think=true")


def _env(config: RunConfig, name: str) -> TextEnv:
    """Env ``name`` of the run, with its options: built here, or the client of the server that plays it."""
    return open_env(name, dict(config.env.options), config.env.remote_for(name), config.env.user_code_timeout_s)


__all__ = [
    "ConfigError",
    "StoredConfig",
    "UntrustedConfigError",
    "build_run_config",
    "build_stored_run_config",
    "check_registered",
    "check_run_start",
    "load_run_config",
    "manifest_config",
]
