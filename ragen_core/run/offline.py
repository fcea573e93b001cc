"""Offline re-training from stored rollouts: trajectories selected by SQL, trained on exactly as stored.

This module decides about the run: which rows (the SQL selection), checked against what (the tokenizer that produced
them), starting from which model (``--init``: a folder, a checkpoint, ``run:<id>[@<updates>]``), recorded how (the
lineage), one epoch at a time in the run's session. The update math itself (``sft``: cross-entropy on the
loss-masked tokens; ``pg``: the StarPO loss with the stored behaviour log-probs as the old policy) is
:mod:`ragen_core.training.offline`. The token ids are never re-tokenised, so the model's tokenizer must be the one
that produced them: each run manifest records its tokenizer's fingerprint and re-training checks it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ragen_core.config.optimisation import TrainerConfig
from ragen_core.config.trust import TRUSTED_PATHS_VARIABLE, trusted_path
from ragen_core.policy import tokenizer_fingerprint
from ragen_core.policy.lora import ADAPTER_CONFIG
from ragen_core.seeding import derive_seed
from ragen_core.storage import DataLake, LakeError, QueryError, QueryRefused, query
from ragen_core.storage.layout import CHECKPOINT_ADAPTER, CHECKPOINT_HF, checkpoint_file, manifest_file
from ragen_core.storage.names import RUN_REF_PREFIX, RunRefError, is_valid_run_id, parse_run_ref
from ragen_core.training.offline import OfflineError, pg_update, sft_update
from schemas.manifest import RunManifest
from schemas.tables import TRAJECTORY_KEY


def select_trajectories(lake: DataLake, sql: str, params: list | dict | None = None) -> pa.Table:
    """The stored trajectories whose keys the read-only ``sql`` returns, whole, in key order.

    The query may return any columns as long as it includes the trajectory key
    (run_id, iteration, split, env, group_id, traj_index), e.g. ``SELECT * FROM trajectories WHERE success``.
    ``params`` binds its ``?`` / ``$name`` placeholders (how code passes a run id: never pasted into ``sql``).
    """
    keys = ", ".join(TRAJECTORY_KEY)
    try:
        selected = query(lake, f"SELECT DISTINCT {keys} FROM ({sql}) AS selection", params=params)
    except Exception as exc:  # noqa: BLE001  (DuckDB raises several error types; all mean the same to the user)
        if isinstance(exc, LakeError) and not isinstance(exc, QueryError | QueryRefused):
            raise  # the lake's own refusal (rows a copy would count twice, a damaged file): no query fixes it
        raise OfflineError(f"the selection query failed: {exc}; it must return the columns {keys}") from exc
    if selected.num_rows == 0:
        raise OfflineError(f"the selection query returned no trajectories: {sql}")
    wanted = set(zip(*(selected[k].to_pylist() for k in TRAJECTORY_KEY), strict=True))
    runs = sorted({key[0] for key in wanted if is_valid_run_id(key[0])})
    parts = [lake.read_table("trajectories", run) for run in runs]
    table = pa.concat_tables(parts) if parts else lake.spec("trajectories").arrow_schema.empty_table()
    stored = list(zip(*(table[k].to_pylist() for k in TRAJECTORY_KEY), strict=True))
    table = table.filter(pa.array([row in wanted for row in stored], pa.bool_()))
    unmatched = wanted - set(stored)
    if unmatched:  # keys made up by the query (or of other tables): nothing stored to train on for them
        example = dict(zip(TRAJECTORY_KEY, min(unmatched, key=repr), strict=True))
        raise OfflineError(
            f"{len(unmatched)} of the {len(wanted)} keys the selection query returned match no stored trajectory "
            f"(e.g. {example}); select rows of the trajectories table, e.g. SELECT * FROM trajectories WHERE ..."
        )
    return table.sort_by([(k, "ascending") for k in TRAJECTORY_KEY])


def preflight(lake: DataLake, run_id: str, sql: str, init: str) -> tuple[StartPolicy, pa.Table]:
    """Everything that can refuse a re-training before it creates anything: no live process writes the run (the
    refusal names it, as train and resume do), the run id is free, ``init`` names a model, the query selects stored
    trajectories, and they were tokenised by the model's tokenizer. Returns the start policy and the selected rows;
    raises :class:`OfflineError`, :class:`~ragen_core.storage.locks.RunLockedError` (or the lake's error)
    otherwise."""
    from ragen_core.policy import load_tokenizer
    from ragen_core.run.record import check_run_id_free
    from ragen_core.storage.locks import check_not_held

    check_not_held(lake.root, run_id)  # a run its writer holds: name the writer, not just "already exists"
    check_run_id_free(lake, run_id)
    start = resolve_init(init, lake)
    table = select_trajectories(lake, sql)
    check_tokenizer(lake, sorted(set(table["run_id"].to_pylist())), load_tokenizer(start.model_dir))
    return start, table


def check_tokenizer(lake: DataLake, runs: list[str], tokenizer: Any) -> str:
    """Refuse trajectories whose run recorded another tokenizer than the model's (or none)."""
    ours = tokenizer_fingerprint(tokenizer)
    for run in runs:
        manifest = lake.read_manifest(run)
        theirs = manifest.tokenizer_fingerprint if manifest is not None else None
        if theirs is None:
            raise OfflineError(
                f"run {run!r} does not record its tokenizer, so its token ids cannot be checked against the model's; "
                "re-generate the data with this version of ragen-flows"
            )
        if theirs != ours:
            raise OfflineError(
                f"run {run!r} was tokenised by another tokenizer ({theirs}) than the model's ({ours}); its token ids "
                "would mean other text to this model. Start from the model that generated them (--init), or select "
                "runs made with this tokenizer"
            )
    return ours


def lineage(sql: str, table: pa.Table, mode: str, init: Path, lake: DataLake | None = None) -> dict[str, Any]:
    """What the re-trained run came from: the query, the source runs and iterations, the mode and the start model
    (with the run and iteration whose checkpoint it is, when it is one of ``lake``). The ``runs`` table shows these as
    its lineage columns."""
    sources: dict[str, set[int]] = {}
    for run, iteration in zip(table["run_id"].to_pylist(), table["iteration"].to_pylist(), strict=True):
        sources.setdefault(run, set()).add(int(iteration))
    init_run, init_iteration = lake.checkpoint_origin(init) if lake is not None else (None, None)
    return {
        "query": sql,
        "mode": mode,
        "init": str(init),
        "init_run": init_run,
        "init_iteration": init_iteration,
        "trajectories": table.num_rows,
        "source_runs": sorted(sources),
        "source_iterations": {run: sorted(its) for run, its in sorted(sources.items())},
    }


@dataclass(frozen=True)
class StartPolicy:
    """A policy to start from or to evaluate: a Hugging Face model folder and, for LoRA adapters, their folder on it
    (what ``model.adapter`` names)."""

    model_dir: Path
    adapter: Path | None = None

    def adapter_override(self) -> str:
        """The ``model.adapter`` override that puts this policy's adapter (or none) on its model folder."""
        return f"model.adapter={json.dumps(str(self.adapter)) if self.adapter is not None else 'null'}"


def resolve_init(path: str | Path, lake: DataLake | None = None) -> StartPolicy:
    """The policy to start from: a Hugging Face model dir, one of our checkpoints (its ``hf/`` export, or its LoRA
    adapters in ``adapter/`` on the start model of its run), or ``run:<run_id>`` (the model that run started from) /
    ``run:<run_id>@<updates>`` (that run's checkpoint). Adapters outside ``lake``'s runs name no base model: an
    :class:`AdapterCheckpointError` says how to name it."""
    text = str(path)
    if text.startswith(RUN_REF_PREFIX):
        if lake is None:
            raise OfflineError("--init run:<id> needs the data root of that run")
        try:
            ref = parse_run_ref(text)
        except RunRefError as exc:
            raise OfflineError(f"--init {text}: {exc}") from None
        manifest = lake.read_manifest(ref.run_id)
        if manifest is None:
            raise OfflineError(f"--init {text}: no run {ref.run_id!r} in {lake.root}")
        if ref.updates is None:
            if not manifest.model_dir:  # its manifest is written before the bootstrap picks the model
                raise OfflineError(f"--init {text}: run {ref.run_id!r} stopped before choosing its start model")
            return resolve_init(_stored_start_model(lake, ref.run_id, manifest.model_dir, text))
        path = lake.checkpoint_dir(ref.run_id, ref.updates)
        if not path.is_dir():
            raise OfflineError(f"--init {text}: {missing_checkpoint(lake, ref.run_id, ref.updates, manifest)}")
    if "\x00" in str(path):  # no file name holds one (resolve() would raise ValueError)
        raise OfflineError(f"--init {str(path)!r} is not a folder name: it contains a NUL character")
    path = Path(path).expanduser().resolve()
    if (checkpoint_file(path, CHECKPOINT_HF) / "config.json").is_file():
        return StartPolicy(checkpoint_file(path, CHECKPOINT_HF))
    if (path / "config.json").is_file():
        return StartPolicy(path)
    if checkpoint_file(path, CHECKPOINT_ADAPTER).is_dir():
        return _adapter_policy(checkpoint_file(path, CHECKPOINT_ADAPTER), lake)
    if (path / ADAPTER_CONFIG).is_file():
        return _adapter_policy(path, lake)
    raise OfflineError(f"--init {str(path)!r} is neither a Hugging Face model folder nor a ragen-flows checkpoint")


def _adapter_policy(adapter: Path, lake: DataLake | None) -> StartPolicy:
    """LoRA adapters of a checkpoint of ``lake`` on the start model of their run, which its manifest names: read only
    inside the data root or a folder the user trusts (as ``run:<id>`` reads it); else the user names it."""
    run_id, _ = lake.checkpoint_origin(adapter) if lake is not None else (None, None)
    manifest = lake.read_manifest(run_id) if lake is not None and run_id is not None else None
    named = "name that model folder yourself, as the model to start from or to evaluate (--init FOLDER, ragen eval "
    named += f"FOLDER), with {shlex.quote('model.adapter=' + str(adapter))}"
    if lake is None or manifest is None or not manifest.model_dir:
        raise AdapterCheckpointError(
            f"{str(adapter)!r} holds LoRA adapters but no run of the data root names the model they adapt: {named}"
        )
    if not trusted_path(manifest.model_dir, lake.root):
        raise AdapterCheckpointError(
            f"{str(adapter)!r} holds LoRA adapters on {manifest.model_dir!r}, the start model of run {run_id!r}, "
            f"outside the data root, which a manifest does not name: {named} (or list its folder in "
            f"{TRUSTED_PATHS_VARIABLE})"
        )
    return StartPolicy(resolve_init(manifest.model_dir).model_dir, adapter)


class AdapterCheckpointError(OfflineError):
    """LoRA adapters named where their base model cannot be found (outside the data root's runs)."""


def missing_checkpoint(lake: DataLake, run_id: str, updates: int, manifest: RunManifest) -> str:
    """Why ``<run_id>@<updates>`` names no checkpoint: the checkpoints the run has, and the settings that chose them
    (``trainer.checkpoint_every``, ``trainer.keep_last``: older ones are deleted) with how to keep more."""
    trainer = (manifest.config or {}).get("trainer") or {}
    fields = TrainerConfig.model_fields
    every = trainer.get("checkpoint_every", fields["checkpoint_every"].default)
    keep = trainer.get("keep_last", fields["keep_last"].default)
    kept = [f"{run_id}@{n}" for n, _ in lake.list_checkpoints(run_id)]
    return (
        f"run {run_id!r} has no checkpoint after {updates} updates; its checkpoints: {', '.join(kept) or 'none yet'} "
        f"(it saved one every {every} update(s) and kept the newest {keep}: trainer.checkpoint_every, "
        "trainer.keep_last; a run trained with e.g. trainer.checkpoint_every=10 trainer.keep_last=4 keeps more)"
    )


def _stored_start_model(lake: DataLake, run_id: str, model_dir: str, init: str) -> str:
    """The start model a manifest names, when it lies inside the data root (or a folder the user trusts,
    :data:`~ragen_core.config.trust.TRUSTED_PATHS_VARIABLE`): a folder outside it is read only when the user names it
    (``--init FOLDER``), never on a manifest's word (:mod:`ragen_core.config.trust`)."""
    if trusted_path(model_dir, lake.root):
        return model_dir
    source = manifest_file(lake.run_dir(run_id)).relative_to(lake.root)
    raise OfflineError(
        f"--init {init}: {source} names the start model {model_dir!r}, outside the data root; a manifest does not "
        f"name folders outside it: pass --init {shlex.quote(model_dir)} to use it (or list its folder in "
        f"{TRUSTED_PATHS_VARIABLE})"
    )


def offline_epoch(session: Any, table: pa.Table, mode: str, epoch: int) -> dict[str, float]:
    """One pass of ``mode`` ('sft' or 'pg') over the selected rows with the session's actor (in this process)."""
    from ragen_core.training.updater import InProcessUpdater

    config, pad = session.config, session.tokenizer.pad_token_id
    if not isinstance(session.updater, InProcessUpdater):
        raise OfflineError("offline re-training runs in the run's own process: set trainer.launcher=inprocess")
    actor = session.updater.actor
    seed = derive_seed(config.seed, epoch, "offline_shuffle")
    if mode == "sft":
        return sft_update(actor, table, pad, config.offline.batch_size, seed)
    if mode == "pg":
        return pg_update(config, actor, table, pad, seed)
    raise OfflineError(f"unknown mode {mode!r}; use 'sft' or 'pg'")
