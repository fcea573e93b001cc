"""A command's typed request, built once by whichever door starts it (the ``ragen`` command, a Prefect deployment's
flow run, the Python API :mod:`ragen_core.api`) and handed down as it is (a sweep's, which stands above the run
layer: :class:`ragen_core.sweep.SweepRequest`).

A builder turns what a user gives (a config path, tree or :class:`RunConfig` and ``key.sub=value`` overrides, a
data root, a run id ...) into a frozen request: the run id checked before anything is read or created, the config
validated once through :mod:`ragen_core.run.checks` (a :class:`RunConfig` without overrides is used as it is), the
data root's :class:`~ragen_core.storage.DataLake` made once (:func:`ragen_core.run.entry.run_lake`). Nothing below a
builder validates a config, makes a lake or checks an id again. A request's :meth:`parameters` are its plain form,
what a deployment's form holds and what Prefect's UI shows of a flow run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_core.config import RunConfig
from ragen_core.run.checks import build_run_config, build_stored_run_config, load_run_config, manifest_config
from ragen_core.run.entry import check_run_id, run_lake
from ragen_core.run.evaluation import evaluation_config, evaluation_run_id, resolve_target
from ragen_core.run.record import default_run_id
from ragen_core.storage import DataLake

ConfigInput = RunConfig | dict[str, Any] | str | Path | None
OFFLINE_MODES = ("sft", "pg")


class RequestError(ValueError):
    """What a user asked for cannot be a request (a run to resume that is not there, an unknown mode): one line that
    says how to fix it."""


def resolve_config(config: ConfigInput, overrides: list[str] | None = None) -> RunConfig:
    """A config tree, or the path of a YAML config file (None: the defaults), plus ``key.sub=value`` overrides,
    validated. A :class:`RunConfig` without overrides is used as it is: a config is validated once."""
    if isinstance(config, RunConfig) and not overrides:
        return config
    if isinstance(config, RunConfig):
        config = config.to_dict()
    if config is None or isinstance(config, (str, Path)):
        return load_run_config(config, list(overrides or []))
    return build_run_config(config, list(overrides or []))


@dataclass(frozen=True)
class RunRequest:
    """Train a run, or go on with it (``ragen train``, ``ragen resume``, the ``train`` flow): its validated config,
    its lake and its checked id. ``force_config``: the config keys allowed to differ from a stored run's;
    ``skip_iteration``: record a quarantined iteration as skipped; ``sweep``: the sweep entry of a sweep's point."""

    config: RunConfig
    lake: DataLake
    run_id: str
    force_config: tuple[str, ...] = ()
    skip_iteration: bool = False
    sweep: dict[str, Any] | None = None

    def parameters(self) -> dict[str, Any]:
        """The request as the ``train`` flow's plain parameters (a deployment's form)."""
        return {
            "config": self.config.to_dict(),
            "data_root": str(self.lake.root),
            "run_id": self.run_id,
            "force_config": list(self.force_config),
            "skip_iteration": self.skip_iteration,
            "sweep": self.sweep,
        }


def run_request(
    config: ConfigInput,
    data_root: str | Path | DataLake = "data",
    run_id: str | None = None,
    overrides: list[str] | None = None,
    force_config: list[str] | tuple[str, ...] | None = None,
    skip_iteration: bool = False,
    sweep: dict[str, Any] | None = None,
) -> RunRequest:
    """The request of a run to train (or resume: an existing ``run_id`` goes on with the given config). The run id is
    checked before the config is read; without one it is derived (``<env>-<hash>-<time>``)."""
    check_run_id(run_id)  # a name, never a pattern or a path: refused before anything is read or created
    run_config = resolve_config(config, overrides)
    lake = run_lake(data_root)
    run_id = check_run_id(run_id or default_run_id(run_config))
    return RunRequest(run_config, lake, run_id, tuple(force_config or ()), skip_iteration, sweep)


def trusted_kinds(trust_env_module: bool) -> frozenset[str]:
    """The kinds of stored keys the user allows by flag: ``{"module"}`` with ``--trust-env-module`` (a stored config
    may then import the modules it names: its envs as ``package.module:Class``, a reward function)."""
    return frozenset({"module"}) if trust_env_module else frozenset()


def resume_request(
    run_id: str,
    data_root: str | Path | DataLake = "data",
    overrides: list[str] | None = None,
    force_config: list[str] | tuple[str, ...] | None = None,
    skip_iteration: bool = False,
    trust_env_module: bool = False,
) -> RunRequest:
    """The request that goes on with a stored run with its own config (read from its manifest and held to the trust
    rules of a config read from the data root; ``overrides`` change it where ``force_config`` allows). Raises
    :class:`RequestError` (no such run, or no config to resume with), :class:`~ragen_core.config.ConfigError`,
    :class:`~ragen_core.storage.LakeError`."""
    check_run_id(run_id)
    lake = run_lake(data_root)
    manifest = lake.read_manifest(run_id) if lake.root.is_dir() else None
    if manifest is None:
        raise RequestError(
            f"no run {run_id!r} in {lake.root}; `ragen runs --data-root {lake.root}` lists the runs there"
        )
    if not manifest.config:
        raise RequestError(
            f"the manifest of run {run_id!r} holds no config to resume with; start the run again with ragen train"
        )
    stored = manifest_config(lake, run_id, manifest.config)  # a program it names, not named again: refused
    run_config = build_stored_run_config(stored, list(overrides or []), trusted_kinds(trust_env_module))
    return RunRequest(run_config, lake, run_id, tuple(force_config or ()), skip_iteration)


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate a policy (``ragen eval``, the ``evaluate`` flow): the target as given, the model folder it names and
    its name (``which``), the evaluation's validated config, its lake and its run id."""

    config: RunConfig
    lake: DataLake
    run_id: str
    target: str
    which: str
    model_dir: Path

    def parameters(self) -> dict[str, Any]:
        """The request as plain parameters (what Prefect's UI shows)."""
        return {
            "target": self.target,
            "data_root": str(self.lake.root),
            "run_id": self.run_id,
            "config": self.config.to_dict(),
        }


def eval_request(
    target: str,
    data_root: str | Path | DataLake = "data",
    envs: list[str] | None = None,
    n: int | None = None,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    trust_env_module: bool = False,
) -> EvalRequest:
    """The request of an evaluation of ``target`` (a run id, ``RUN_ID@N``, a checkpoint or a model folder): the base
    config is the source run's, or ``config`` (a YAML path), with ``envs``, ``n`` and ``overrides`` set. Raises
    :class:`~ragen_core.run.evaluation.EvaluationError`, :class:`~ragen_core.config.ConfigError`."""
    check_run_id(run_id)
    if n is not None and n < 1:
        raise RequestError(f"n (the validation instances per env) must be at least 1, not {n}")
    lake = run_lake(data_root)
    known = lake if lake.root.is_dir() else None  # a data root not made yet holds no run to read
    model_dir, base, which = resolve_target(target, known)
    run_config = evaluation_config(base, envs, n, config, overrides, trusted_kinds(trust_env_module))
    run_id = check_run_id(run_id or evaluation_run_id(which, run_config, known))
    return EvalRequest(run_config, lake, run_id, target, which, model_dir)


@dataclass(frozen=True)
class RetrainRequest:
    """Re-train a model offline on stored trajectories (``ragen retrain``, the ``retrain_offline`` flow): ``sql``
    selects them, ``mode`` is sft or pg, ``init`` names the start model; the config's ``trainer.iterations`` is its
    ``offline.epochs`` (each epoch is committed as an iteration)."""

    config: RunConfig
    lake: DataLake
    run_id: str
    sql: str
    mode: str
    init: str

    def parameters(self) -> dict[str, Any]:
        """The request as the ``retrain_offline`` flow's plain parameters."""
        return {
            "config": self.config.to_dict(),
            "sql": self.sql,
            "mode": self.mode,
            "init": self.init,
            "data_root": str(self.lake.root),
            "run_id": self.run_id,
        }


def retrain_request(
    config: ConfigInput,
    sql: str,
    mode: str,
    init: str,
    data_root: str | Path | DataLake = "data",
    run_id: str | None = None,
    overrides: list[str] | None = None,
) -> RetrainRequest:
    """The request of an offline re-training; the run id defaults to ``retrain-<mode>-<hash of the config given>``."""
    check_run_id(run_id)
    if mode not in OFFLINE_MODES:
        raise RequestError(f"mode must be sft or pg, not {mode!r}")
    given = resolve_config(config, overrides)
    run_id = check_run_id(run_id or f"retrain-{mode}-{given.config_hash()[:8]}")
    epochs = given.offline.epochs  # each epoch is committed as an iteration: the run has `epochs` iterations
    trainer = given.trainer.model_copy(update={"iterations": epochs})  # both validated positive integers
    run_config = given.model_copy(update={"trainer": trainer})
    return RetrainRequest(run_config, run_lake(data_root), run_id, sql, mode, init)


__all__ = [
    "EvalRequest",
    "RequestError",
    "RetrainRequest",
    "RunRequest",
    "eval_request",
    "resolve_config",
    "resume_request",
    "retrain_request",
    "run_request",
    "trusted_kinds",
]
