"""Stand-alone evaluation (``ragen eval``): validation rollouts of any policy, stored as an evaluation run.

The target is a run id (its newest checkpoint; ``RUN_ID@N`` for the checkpoint after N updates), a checkpoint folder
(its ``hf/`` export) or any local Hugging Face model folder. The result is a run of kind ``evaluation`` whose
``split='val'`` trajectories, turns, metrics and evaluations rows sit in the lake beside the training runs, so one
SQL query compares them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ragen_core.config import RunConfig
from ragen_core.envs import env_factory
from ragen_core.run.checks import (
    StoredConfig,
    build_run_config,
    build_stored_run_config,
    load_run_config,
    manifest_config,
)
from ragen_core.run.offline import (
    AdapterCheckpointError,
    OfflineError,
    StartPolicy,
    missing_checkpoint,
    resolve_init,
)
from ragen_core.storage import DataLake
from ragen_core.storage.names import (
    RUN_REF_PREFIX,
    RunRefError,
    is_valid_run_id,
    parse_run_ref,
    split_run_ref,
    without_split_words,
)


class EvaluationError(ValueError):
    """An evaluation target or request that cannot run (unknown run, no checkpoint, unknown env)."""


def resolve_target(target: str, lake: DataLake | None) -> tuple[StartPolicy, StoredConfig | None, str]:
    """(the policy, the source run's stored config or None, a description) of ``target``.

    A run id resolves to its newest checkpoint's ``hf/`` export, or its LoRA adapters on the run's start model
    (``RUN_ID@N``: the checkpoint after N updates), and its config becomes the evaluation's base (same prompt format
    and limits), read from its manifest: a program or outside folder it names is used only when the user names it
    again (:func:`evaluation_config`). Anything else must be a folder.
    """
    run_id, updates = split_run_ref(target)
    known = lake is not None and is_valid_run_id(run_id)  # else: a folder
    manifest = lake.read_manifest(run_id) if known else None
    if manifest is not None:
        if updates:
            try:
                parse_run_ref(target)
            except RunRefError as exc:
                raise EvaluationError(f"{target!r}: {exc}") from None
            folder = lake.checkpoint_dir(run_id, int(updates))
            if not folder.is_dir():
                raise EvaluationError(missing_checkpoint(lake, run_id, int(updates), manifest))
            which = f"{run_id}@{updates}"
        else:
            newest = lake.latest_checkpoint(run_id)
            if newest is None:
                raise EvaluationError(
                    f"run {run_id!r} has no checkpoint yet; evaluate the model it started from instead: "
                    f"{manifest.model_dir}"
                )
            folder, which = newest[1], f"{run_id}@{newest[0]}"
        stored = manifest_config(lake, run_id, manifest.config) if manifest.config is not None else None
        try:
            return resolve_init(folder, lake), stored, which
        except AdapterCheckpointError as exc:  # its adapters' base: outside the data root, not named again
            raise EvaluationError(str(exc)) from None
    if target.startswith(RUN_REF_PREFIX) or updates:
        where = lake.root if lake else "the data root"
        raise EvaluationError(f"no run {run_id!r} in {where}; `ragen runs` lists them")
    try:
        return resolve_init(target, lake), None, str(Path(target).expanduser().resolve())
    except AdapterCheckpointError as exc:
        raise EvaluationError(str(exc)) from None
    except OfflineError:
        raise EvaluationError(
            f"{target!r} is neither a run id in {lake.root if lake else 'the data root'} nor a Hugging Face model "
            "folder or checkpoint folder"
        ) from None


def evaluation_config(
    base: StoredConfig | dict[str, Any] | None,
    envs: list[str] | None,
    instances: int | None,
    config_path: str | Path | None = None,
    overrides: list[str] | None = None,
    trusted_kinds: frozenset[str] = frozenset(),
) -> RunConfig:
    """The evaluation's config: the source run's (``base``: as :func:`resolve_target` read it from the data root, or
    a tree of the caller's), else the YAML file's, else the defaults, with the validation envs (``env.val_envs``),
    the instance count (``eval.instances``) and any ``key=value`` overrides set. A stored base naming a program or an
    outside folder the overrides do not name again is refused
    (:class:`~ragen_core.config.trust.UntrustedConfigError`), unless its kind is one of ``trusted_kinds``
    (``{"module"}``: ``--trust-env-module``). ``envs`` are the user's: registered names, installed distributions'
    names or ``package.module:Class``."""
    for name in envs or []:
        try:
            env_factory(name, "--env")
        except ValueError as exc:
            raise EvaluationError(str(exc)) from None
    extra = list(overrides or [])
    if envs:
        extra.append(f"env.val_envs={json.dumps(list(envs))}")
    if instances is not None:
        extra.append(f"eval.instances={int(instances)}")
    if isinstance(base, StoredConfig) and config_path is None:
        return build_stored_run_config(base, extra, trusted_kinds)
    if base is not None and config_path is None:
        return build_run_config(base, extra)
    return load_run_config(config_path, extra)


EVALUATION_PREFIX = "evaluate-"  # no split word of Hugging Face datasets (ragen_core.storage.names.SPLIT_WORDS)
LEGACY_EVALUATION_PREFIX = "eval-"  # the evaluations stored before: still found, never made anew


def evaluation_run_id(which: str, config: RunConfig, lake: DataLake | None = None) -> str:
    """``evaluate-<target slug>-<hash of target and config>``: the same evaluation names the same run. The slug holds
    no split word of Hugging Face ``datasets`` (written short: :func:`~ragen_core.storage.names.without_split_words`),
    so ``load_dataset("parquet", data_dir=<table folder>)`` never takes the run for a split. An evaluation stored
    in ``lake`` before under its old name (``eval-<slug>-<hash>``) keeps that name: it is found and reused."""
    name = Path(which).name or which  # ASCII only: the id must be a run-id name (ragen_core.storage.names)
    slug = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "-" for c in name).strip("-")[:40]
    digest = hashlib.sha256(f"{which}|{config.config_hash()}".encode()).hexdigest()[:8]
    legacy = f"{LEGACY_EVALUATION_PREFIX}{slug}-{digest}"
    if lake is not None and is_valid_run_id(legacy) and lake.read_manifest(legacy) is not None:
        return legacy
    return f"{EVALUATION_PREFIX}{without_split_words(slug)}-{digest}"
