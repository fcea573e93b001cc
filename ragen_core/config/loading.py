"""From YAML and ``key.sub=value`` overrides to a validated :class:`RunConfig`, and a stored run's config read back.

This validates the plain data (types, ranges, keys that must fit together); the names a config gives of registered
things (environments, estimators, losses, filters, scripted policies) are checked by ``ragen_core.run.checks``,
whose ``build_run_config`` / ``load_run_config`` every path that builds a config for a run goes through.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragen_core.config.errors import ConfigError, format_validation_error
from ragen_core.config.monitoring import trackers_for_tensorboard
from ragen_core.config.tree import RunConfig
from ragen_core.config.yaml_text import load_yaml, read_yaml_file


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value (e.g. rollout.group_size=8)")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ConfigError(f"override {text!r} has an empty key")
    shown = text if len(text) <= 80 else text[:60] + "..."
    value = load_yaml(raw, f"the value of override {shown!r}") if raw.strip() else ""
    return path, value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``tree`` with each ``key.sub=value`` override set (intermediate sections created). A key set
    twice (``a.b=1 a.b=2``, or ``a.b=1`` beside ``a={b: 2}``) is an error: which one was meant is unknowable."""
    result = copy.deepcopy(tree)
    given: dict[tuple[str, ...], str] = {}
    for text in overrides:
        path, value = parse_override(text)
        for earlier_path, earlier in given.items():
            shorter = min(len(path), len(earlier_path))
            if tuple(path[:shorter]) == earlier_path[:shorter]:
                raise ConfigError(
                    f"overrides {earlier!r} and {text!r} both set {'.'.join(path[:shorter])}; give it once"
                )
        given[tuple(path)] = text
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return result


# Keys added after runs were stored whose default is not how those runs behaved: a stored config that lacks one of
# them behaved as the value here (RAGEN's <think> prefix came with rollout.think_prefix; earlier prompts had none).
# Old runs re-scored their old log-probs (actor.reuse_behavior_logprobs came later): replaying them so keeps their
# updates bit for bit.
# Runs stored before RAGEN-2's MI span and headline took the think block (or the whole reply) and warned on the summed
# estimate. Runs stored before algorithm.filter_empty_stop_steps never stopped early. Runs stored before
# rollout.reply_format read replies leniently (tags found anywhere, truncation ignored) and were not warned of
# truncated replies. Runs stored before actor.micro_batch_tokens cut fixed-row micro-batches in schedule order.
# Runs stored before eval.held_out validated on held-out seeds whose maps training could also draw.
STORED_CONFIG_FALLBACKS: dict[str, Any] = {
    "rollout.think_prefix": False,
    "actor.reuse_behavior_logprobs": "never",
    "trainer.mi_reasoning": "block",
    "monitor.mi_metric": "sequence",
    "monitor.success_slip": None,
    "algorithm.filter_empty_stop_steps": 0,
    "rollout.reply_format": "lenient",
    "monitor.truncated_share": None,
    "actor.micro_batch_tokens": None,
    "eval.held_out": "seeds",
}


def stored_config(tree: dict[str, Any]) -> dict[str, Any]:
    """A run's stored config tree (its manifest's ``config``) with the keys it predates filled in as the run behaved
    (:data:`STORED_CONFIG_FALLBACKS`) and its retired keys spelled as now (``monitor.tensorboard: true`` is
    ``monitor.trackers: [tensorboard]``); use it wherever a run's own config is read back (resume, evaluation)."""
    filled = copy.deepcopy(tree)
    monitor = filled.get("monitor")
    if isinstance(monitor, dict) and isinstance(monitor.get("tensorboard"), bool) and "trackers" not in monitor:
        monitor["trackers"] = trackers_for_tensorboard(monitor.pop("tensorboard"))
    for dotted, value in STORED_CONFIG_FALLBACKS.items():
        section, key = dotted.split(".")
        part = filled.setdefault(section, {})
        if isinstance(part, dict):
            part.setdefault(key, value)
    return filled


def build_config(tree: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Validate a config tree (plus overrides) into a frozen :class:`RunConfig`; raise :class:`ConfigError`. The plain
    data only: a config for a run comes from ``ragen_core.run.checks.build_run_config``, which also checks its names
    against the registries."""
    merged = apply_overrides(tree or {}, overrides or [])
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config file (or the defaults when ``path`` is None) and apply ``key.sub=value`` overrides (the plain
    data, as :func:`build_config`; for a run: ``ragen_core.run.checks.load_run_config``)."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        loaded = read_yaml_file(path)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {str(path)!r} must hold a mapping of sections, got {type(loaded).__name__}"
            )
        tree = loaded or {}
    return build_config(tree, overrides)
