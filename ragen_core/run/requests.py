"""Requests: what a command was asked to do, checked and ready to run.

Each command's inputs are one pydantic model (:mod:`ragen_core.run.inputs`) whose fields are the flow's parameters,
the API function's arguments and the command line's options (tests/flows/test_inputs.py holds the three to it). A
builder here turns the inputs into a frozen request, and it is the only place that checks them, so the command line,
the API and a deployment refuse a bad input with the same message before anything is written:

- the run id is a plain name (checked before anything is read or created);
- the config is valid (validated once, through :mod:`ragen_core.run.checks`; a :class:`RunConfig` given without
  overrides is used as it is);
- this machine can run the config's precision;
- what the config names outside this process answers (an env server, an MCP server:
  :func:`~ragen_core.run.checks.check_run_start`), asked when a run starts, never when a config is only loaded;
- the data root is a folder that can be written (made when the command may make it);
- for a re-training, the start model exists, the query selects stored trajectories, and their tokenizer is the
  model's.

Code below a builder never validates a config, makes a :class:`~ragen_core.storage.DataLake` or checks an id again.
A sweep's request stands above the run layer (:class:`ragen_core.sweep.SweepRequest`). A request's
:meth:`parameters` are its plain form, what Prefect's UI shows of a flow run.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from ragen_core.config import RunConfig
from ragen_core.config.trust import named_keys
from ragen_core.run.checks import (
    build_run_config,
    build_stored_run_config,
    check_run_start,
    load_run_config,
    manifest_config,
)
from ragen_core.run.entry import check_run_id, run_lake
from ragen_core.run.evaluation import evaluation_config, evaluation_run_id, resolve_target
from ragen_core.run.inputs import EvalInputs, RequestError, ResumeInputs, RetrainInputs, TrainInputs
from ragen_core.run.record import default_run_id
from ragen_core.storage import DataLake
from ragen_core.storage.names import RUN_REF_PREFIX, RunRefError, parse_run_ref

ConfigInput = RunConfig | dict[str, Any] | str | Path | None
OFFLINE_MODES = ("sft", "pg")


def _check_precision(config: RunConfig) -> None:
    """The config's ``trainer.precision`` runs on this machine (bf16/fp16 need CUDA): else
    :class:`~ragen_core.training.precision.PrecisionError`, which says what to set instead."""
    from ragen_core.training.precision import resolve_precision  # torch, imported when a request is built

    resolve_precision(config.trainer.precision)


def writable_lake(data_root: str | Path | DataLake, create: bool, only: str | None = "write") -> DataLake:
    """The lake of ``data_root``, its folder proven writable by creating and removing a temporary file in it (made
    first when ``create``), so a read-only or impossible root is refused before any compute is spent (``only``: what
    the local copy of an object-store root holds, :func:`~ragen_core.run.entry.run_lake`)."""
    lake = run_lake(data_root, only)
    root = Path(lake.root)
    if root.exists() and not root.is_dir():
        raise RequestError(f"data root {str(root)!r} is a file, not a folder; name a folder as the data root")
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
        if root.is_dir():
            with tempfile.TemporaryFile(dir=root, prefix=".ragen-write-check-"):
                pass
    except OSError as exc:
        raise RequestError(
            f"data root {str(root)!r} cannot be written ({exc.strerror or exc}); name a writable folder as the data "
            "root"
        ) from None
    return lake


def refusals() -> tuple[type[Exception], ...]:
    """The errors a builder refuses an input with, each one line that says what to fix: a door shows them as they
    are (the command line on stderr, the API raised, a deployment's flow run failed with the message)."""
    from ragen_core.config import ConfigError
    from ragen_core.run.evaluation import EvaluationError
    from ragen_core.run.offline import OfflineError
    from ragen_core.run.record import RunExistsError
    from ragen_core.storage import LakeError
    from ragen_core.training.precision import PrecisionError

    return ConfigError, RequestError, LakeError, PrecisionError, OfflineError, RunExistsError, EvaluationError


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


def run_request(inputs: TrainInputs) -> RunRequest:
    """The request to train a run (an existing ``run_id`` goes on with the given config). Without a run id one is
    derived (``<env>-<hash>-<time>``). The data root is made only once the config is valid."""
    check_run_id(inputs.run_id)  # a name, never a pattern or a path: refused before anything is read or created
    run_config = resolve_config(inputs.config, inputs.overrides)
    _check_precision(run_config)
    check_run_start(run_config)
    lake = writable_lake(inputs.data_root, create=True)
    run_id = check_run_id(inputs.run_id or default_run_id(run_config))
    force = tuple(inputs.force_config or ())
    return RunRequest(run_config, lake, run_id, force, inputs.skip_iteration, inputs.sweep)


def trusted_kinds(trust_env_module: bool) -> frozenset[str]:
    """The kinds of stored keys the user allows by flag: ``{"module"}`` with ``--trust-env-module`` (a stored config
    may then import the modules it names: its envs as ``package.module:Class``, a reward function)."""
    return frozenset({"module"}) if trust_env_module else frozenset()


def resume_request(inputs: ResumeInputs) -> RunRequest:
    """The request that goes on with a stored run with its own config (read from its manifest and held to the trust
    rules of a config read from the data root; ``overrides`` change it where ``force_config`` allows). Raises
    :class:`RequestError` (no such run, or no config to resume with), :class:`~ragen_core.config.ConfigError`,
    :class:`~ragen_core.storage.LakeError`."""
    run_id = check_run_id(inputs.run_id)
    lake = writable_lake(inputs.data_root, create=False)
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
    trusted = trusted_kinds(inputs.trust_env_module)
    run_config = build_stored_run_config(stored, list(inputs.overrides or []), trusted)
    _check_precision(run_config)
    check_run_start(run_config)
    return RunRequest(run_config, lake, run_id, tuple(inputs.force_config or ()), inputs.skip_iteration)


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


def eval_request(inputs: EvalInputs) -> EvalRequest:
    """The request of an evaluation of ``target`` (a run id, ``RUN_ID@N``, a checkpoint or a model folder): the base
    config is the source run's, or ``config`` (a YAML path), with ``envs``, ``n`` and ``overrides`` set. Raises
    :class:`~ragen_core.run.evaluation.EvaluationError`, :class:`~ragen_core.config.ConfigError`."""
    check_run_id(inputs.run_id)
    if inputs.n is not None and inputs.n < 1:
        raise RequestError(f"n (the validation instances per env) must be at least 1, not {inputs.n}")
    lake = writable_lake(inputs.data_root, create=False, only=None)  # a bucket's copy: other runs' checkpoints too
    known = lake if lake.root.is_dir() else None  # a data root not made yet holds no run to read
    start, base, which = resolve_target(inputs.target, known)
    trusted = trusted_kinds(inputs.trust_env_module)
    overrides = list(inputs.overrides or [])
    named = bool({"model", "model.adapter"} & named_keys(overrides))
    if named and start.adapter is not None:
        raise RequestError(f"{inputs.target} names LoRA adapters, and model.adapter names others: give one of the two")
    if not named:  # the target's adapters (or none), never the source run's own model.adapter
        overrides.insert(0, start.adapter_override())
    run_config = check_run_start(evaluation_config(base, inputs.envs, inputs.n, inputs.config, overrides, trusted))
    run_id = check_run_id(inputs.run_id or evaluation_run_id(which, run_config, known))
    if not lake.root.is_dir():  # the evaluation is stored as a run: its root made once it passed
        writable_lake(lake, create=True)
    return EvalRequest(run_config, lake, run_id, inputs.target, which, start.model_dir)


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
    init_dir: Path = field(compare=False)  # the model folder ``init`` names (its adapters: model.adapter), resolved
    selected: pa.Table = field(compare=False, repr=False)  # the stored trajectories ``sql`` selects, checked

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


def retrain_request(inputs: RetrainInputs) -> RetrainRequest:
    """The request of an offline re-training, every refusal made before anything is created: the run id (default
    ``retrain-<mode>-<hash of the config given>``) well formed, free and written by no live process, the mode, the
    data root there and writable, ``init`` a model, the query selecting stored trajectories tokenised by that model's
    tokenizer (:func:`ragen_core.run.offline.preflight`). Raises :class:`RequestError`,
    :class:`~ragen_core.run.offline.OfflineError`, :class:`~ragen_core.config.ConfigError`,
    :class:`~ragen_core.storage.LakeError`."""
    from ragen_core.run.offline import preflight

    check_run_id(inputs.run_id)
    _check_init(inputs.init)
    if inputs.mode not in OFFLINE_MODES:
        raise RequestError(f"mode must be sft or pg, not {inputs.mode!r}")
    given = resolve_config(inputs.config, inputs.overrides)
    _check_precision(given)
    run_id = check_run_id(inputs.run_id or f"retrain-{inputs.mode}-{given.config_hash()[:8]}")
    epochs = given.offline.epochs  # each epoch is committed as an iteration: the run has `epochs` iterations
    trainer = given.trainer.model_copy(update={"iterations": epochs})  # both validated positive integers
    run_config = given.model_copy(update={"trainer": trainer})
    lake = run_lake(inputs.data_root, None)  # a bucket's copy: all of it (--init may name another run's checkpoint)
    if not Path(lake.root).is_dir():
        raise RequestError(
            f"data root {str(lake.root)!r} does not exist; name the data root that holds the trajectories (or train "
            "first)"
        )
    writable_lake(lake, create=False)
    start, table = preflight(lake, run_id, inputs.sql, inputs.init)
    if start.adapter is not None:  # LoRA adapters on their run's start model (docs/lora.md)
        if run_config.model.adapter is not None:
            raise RequestError(
                f"--init {inputs.init} names LoRA adapters, and model.adapter names others: give one of the two"
            )
        run_config = build_run_config(run_config.to_dict(), [start.adapter_override()])
    check_run_start(run_config)  # last: it may start an MCP server program
    return RetrainRequest(run_config, lake, run_id, inputs.sql, inputs.mode, inputs.init, start.model_dir, table)


def _check_init(init: str) -> None:
    """The run named by ``init`` = ``run:<id>[@<updates>]`` is a name too: refused (the whole text) unless well
    formed."""
    if not init.startswith(RUN_REF_PREFIX):
        return
    try:
        parse_run_ref(init)
    except RunRefError:  # the whole text is then no run id: refused as one, with the rule
        check_run_id(init.removeprefix(RUN_REF_PREFIX), "init run id")


__all__ = [
    "EvalInputs",
    "EvalRequest",
    "RequestError",
    "ResumeInputs",
    "RetrainInputs",
    "RetrainRequest",
    "RunRequest",
    "TrainInputs",
    "eval_request",
    "resolve_config",
    "refusals",
    "resume_request",
    "retrain_request",
    "run_request",
    "trusted_kinds",
    "writable_lake",
]
