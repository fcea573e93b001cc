"""One validated, frozen config tree for a RAGEN-Flows run: plain data.

Configs load from YAML and accept ``key.sub=value`` overrides (values parsed as YAML, so ``0.5``, ``true``,
``[1, 2]`` keep their types). Unknown keys, wrong types and out-of-range values fail at load time with a
message naming the key, before any compute is spent. ``config_hash`` is a stable digest of the resolved tree
(sorted-key JSON), used to tell whether two runs trained with the same settings.

The package imports none of the registries (algos, envs, rollout, ...): the names a config gives of registered things
are checked by ``ragen_core.run.checks``, whose ``build_run_config`` / ``load_run_config`` build every run's config.

Modules: :mod:`.base` (what every section shares), :mod:`.generation` (model, env, rollout), :mod:`.algorithm` (the
algorithm section and its presets), :mod:`.optimisation` (actor, critic, offline, trainer, bootstrap),
:mod:`.monitoring` (eval, monitor), :mod:`.tree` (:class:`RunConfig`), :mod:`.yaml_text` (reading YAML),
:mod:`.loading` (overrides, stored configs, :func:`build_config`, :func:`load_config`), :mod:`.errors`,
:mod:`.describe` (every key with its value, default and description: ``ragen config show``).
"""

from ragen_core.config.algorithm import PRESET_NAMES, PRESETS, AlgorithmConfig, preset_field
from ragen_core.config.base import MAX_COUNT, MAX_NEW_TOKENS, PositiveInt
from ragen_core.config.errors import ConfigError
from ragen_core.config.generation import (
    EnvConfig,
    McpServerConfig,
    ModelConfig,
    RolloutConfig,
    TinyModelConfig,
    VLLMConfig,
)
from ragen_core.config.loading import (
    STORED_CONFIG_FALLBACKS,
    apply_overrides,
    build_config,
    load_config,
    parse_override,
    stored_config,
)
from ragen_core.config.monitoring import EvalConfig, MonitorConfig
from ragen_core.config.optimisation import (
    ActorConfig,
    BootstrapConfig,
    CriticConfig,
    LoraConfig,
    OfflineConfig,
    TrainerConfig,
)
from ragen_core.config.tree import RunConfig
from ragen_core.config.yaml_text import YAML_MAX_BYTES, YAML_MAX_DEPTH, YAML_MAX_NODES, load_yaml, read_yaml_file

__all__ = [
    "MAX_COUNT",
    "MAX_NEW_TOKENS",
    "PRESETS",
    "PRESET_NAMES",
    "STORED_CONFIG_FALLBACKS",
    "YAML_MAX_BYTES",
    "YAML_MAX_DEPTH",
    "YAML_MAX_NODES",
    "ActorConfig",
    "AlgorithmConfig",
    "BootstrapConfig",
    "ConfigError",
    "CriticConfig",
    "EnvConfig",
    "EvalConfig",
    "LoraConfig",
    "McpServerConfig",
    "ModelConfig",
    "MonitorConfig",
    "OfflineConfig",
    "PositiveInt",
    "RolloutConfig",
    "RunConfig",
    "TinyModelConfig",
    "TrainerConfig",
    "VLLMConfig",
    "apply_overrides",
    "build_config",
    "load_config",
    "load_yaml",
    "parse_override",
    "preset_field",
    "read_yaml_file",
    "stored_config",
]
