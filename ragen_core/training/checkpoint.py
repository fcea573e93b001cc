"""Checkpoints of a run: the DeepSpeed engine states (for exact resume) and a Hugging Face export of the policy.

Contents of a checkpoint folder (the lake places it, :meth:`DataLake.checkpoint_dir`, inside the run's folder so
that removing the run removes its checkpoints)::

    <checkpoint folder>/
        checkpoint.json     run_id, iteration (= updates the weights include), created_at, extra, and the sha256
                            of every other file of the checkpoint ("files"); written last
        actor/state/        DeepSpeed ``save_checkpoint`` of the actor: weights, optimizer, lr scheduler, step counters
        critic/state/       the same for the critic, when the run has one
        hf/                 ``save_pretrained`` of the policy and its tokenizer (safetensors): plain
                            ``AutoModelForCausalLM.from_pretrained`` and vLLM load it; its chat template ends the
                            generation prompt with the run's reply prefix (``<think>``), as training prompts do
                            (:mod:`ragen_core.agent.templates`)
        adapter/            under LoRA (``actor.lora``), in place of ``hf/``: PEFT's ``save_pretrained`` of the
                            adapters (``adapter_config.json``, ``adapter_model.safetensors``) and the tokenizer; the
                            engine state then holds the adapters (and the optimizer's state of them) only, and
                            ``checkpoint.json`` records the adapters' settings and the sha256 of the base weights,
                            which a load onto another base refuses

A save is atomic: everything is built in a hidden sibling of the folder, fsynced, then renamed into place, so a
checkpoint folder the lake lists is always complete. Hidden leftovers of a crash are ignored by the readers and
deleted by the next save. The folder name is the source of truth: DeepSpeed's ``latest`` file is not
written, and the engine state is loaded with an explicit tag.

Nothing read from a checkpoint is trusted (the data root is shared; see :mod:`ragen_core.training.checkpoint_files`):
a load first checks the engine folders against the digests of ``checkpoint.json`` (a damaged, changed, missing or
extra file is refused and named), then DeepSpeed reads its state files through ``torch.load(weights_only=True)``
with an allow-list of DeepSpeed's plain types, so a planted pickle cannot run code. A checkpoint written before
digests were recorded (``format_version`` 1) is loaded the same safe way, without the digest check (a warning says
so). Under a launcher every rank calls :func:`save_checkpoint` / :func:`load_checkpoint`
(DeepSpeed saves each rank's ZeRO shard; under ZeRO-3 the export gathers the partitioned weights, a collective);
rank 0 alone touches the folders and writes the export.

:func:`export_policy` writes the same Hugging Face export on its own (atomically replacing a folder): a launched
update group hands the new weights to the rollout side through it after every update, and
:func:`load_exported_weights` copies them into the rollout process's model.
"""

from __future__ import annotations

import copy
import glob
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ragen_core.agent.templates import export_chat_template
from ragen_core.faults import maybe_fail
from ragen_core.policy.loading import follow_umask
from ragen_core.policy.lora import (
    ADAPTER_CONFIG,
    adapter_settings,
    is_adapted,
    key_mismatch,
    load_adapter_weights,
    save_adapter,
)
from ragen_core.storage.files import TRASH_PREFIX, fsync_dir
from ragen_core.storage.lake import DataLake
from ragen_core.storage.layout import (
    CHECKPOINT_ACTOR,
    CHECKPOINT_ADAPTER,
    CHECKPOINT_CRITIC,
    CHECKPOINT_ENGINE_STATE,
    CHECKPOINT_HF,
    CHECKPOINT_INFO,
    checkpoint_file,
    engine_state_dir,
)
from ragen_core.training.actor import ActorEngine
from ragen_core.training.checkpoint_files import CheckpointError, safe_engine_loading, tree_digests, verify_digests
from ragen_core.training.critic import CriticEngine

INFO_FILE = CHECKPOINT_INFO  # the lake lists a checkpoint folder as complete once this file is in it
ENGINE_TAG = CHECKPOINT_ENGINE_STATE  # DeepSpeed's tag: its sub-folder name inside actor/ and critic/
FORMAT_VERSION = 2  # 2: checkpoint.json records the sha256 of every file ("files")
_TEMP_PREFIX = ".tmp-"

LOG = logging.getLogger(__name__)


def read_checkpoint_info(path: str | Path) -> dict[str, Any]:
    """The ``checkpoint.json`` of a checkpoint folder; a :class:`CheckpointError` if it is missing or damaged."""
    info_path = checkpoint_file(Path(path), INFO_FILE)
    if not info_path.is_file():
        raise CheckpointError(
            f"{str(path)!r} is not a complete checkpoint (no {INFO_FILE}); a save into it may have been cut off: "
            "use list_checkpoints / latest_checkpoint to find complete ones"
        )
    try:
        return json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {str(info_path)!r} (damaged?): {exc}") from exc


# -- save --------------------------------------------------------------------------------------------------------
def save_checkpoint(
    lake: DataLake,
    run_id: str,
    iteration: int,
    actor: ActorEngine,
    critic: CriticEngine | None,
    tokenizer: Any,
    extra: dict[str, Any] | None = None,
    reply_prefix: str = "",
) -> Path:
    """Save the engines after ``iteration`` updates, atomically; return the checkpoint folder.

    Writes the actor's (and critic's) DeepSpeed state, the Hugging Face export of the policy with ``tokenizer``
    (its chat template appending ``reply_prefix``, the text training prompts end with, to the generation prompt),
    and ``checkpoint.json`` with ``extra`` (JSON-serialisable: config hash, metrics, ...). An existing checkpoint
    of the same iteration is replaced. Call it on every rank when running under a launcher.
    """
    final = lake.checkpoint_dir(run_id, iteration)
    temp = final.with_name(_TEMP_PREFIX + final.name)
    info = _info(run_id, iteration, actor, critic, extra or {})
    json.dumps(info, default=_json_value)  # unserialisable ``extra`` fails before anything is written
    if _rank() == 0:
        _clean_leftovers(final.parent)
        temp.mkdir(parents=True)
    _barrier()
    actor_state = str(checkpoint_file(temp, CHECKPOINT_ACTOR))
    with _trainable_state(actor):  # under LoRA the frozen base is the start model: its weights are not saved again
        actor.engine.save_checkpoint(
            actor_state, tag=ENGINE_TAG, save_latest=False, exclude_frozen_parameters=actor.adapter
        )
    if critic is not None:
        critic.engine.save_checkpoint(str(checkpoint_file(temp, CHECKPOINT_CRITIC)), tag=ENGINE_TAG, save_latest=False)
    maybe_fail("checkpoint", "mid_save", iteration)
    state_dict = _full_state_dict(actor)  # every rank (a collective under ZeRO-3)
    _barrier()  # every rank's shard is written before rank 0 takes the digests
    if _rank() == 0:
        _save_policy(actor, temp, state_dict, tokenizer, reply_prefix)
        info["files"] = tree_digests(temp, skip=(INFO_FILE,))  # what a load checks before reading anything
        text = json.dumps(info, indent=2, sort_keys=True, default=_json_value)
        checkpoint_file(temp, INFO_FILE).write_text(text)  # last: its presence marks the folder complete
        _fsync_tree(temp)
        _replace_dir(temp, final)
    _barrier()
    return final


def _save_policy(actor: ActorEngine, folder: Path, state_dict: Any, tokenizer: Any, reply_prefix: str) -> None:
    """The checkpoint's policy with ``tokenizer``: the Hugging Face export (``hf/``), or the adapters
    (``adapter/``) of a LoRA engine."""
    if actor.adapter:
        target = checkpoint_file(folder, CHECKPOINT_ADAPTER)
        save_adapter(actor.module, target, state_dict)
    else:
        target = checkpoint_file(folder, CHECKPOINT_HF)
        actor.module.save_pretrained(str(target), state_dict=state_dict)
    save_tokenizer(tokenizer, target, reply_prefix)
    follow_umask(target)  # transformers and PEFT write the weights 0600


@contextmanager
def _trainable_state(actor: ActorEngine) -> Iterator[None]:
    """Within the block, a LoRA engine's saved module state leaves out every frozen weight. DeepSpeed's
    ``exclude_frozen_parameters`` leaves out the names ``named_parameters`` lists, not a tied alias of one: the output
    head tied to the embedding (the tiny model's, Qwen2.5-0.5B's) would be saved whole."""
    if not actor.adapter:
        yield
        return
    engine, own = actor.engine, actor.engine.module_state_dict

    def trainable(*args: Any, **kwargs: Any) -> dict[str, Any]:
        frozen = {n for n, p in engine.module.named_parameters(remove_duplicate=False) if not p.requires_grad}
        return {name: value for name, value in own(*args, **kwargs).items() if name not in frozen}

    engine.module_state_dict = trainable
    try:
        yield
    finally:
        del engine.module_state_dict  # the instance attribute: the class's method shows again


def save_tokenizer(tokenizer: Any, folder: str | Path, reply_prefix: str = "") -> None:
    """``tokenizer.save_pretrained(folder)`` with the export's chat template: the tokenizer's own, with
    ``reply_prefix`` appended to the generation prompt (:func:`ragen_core.agent.templates.export_chat_template`).
    The run's tokenizer itself is not changed (a shallow copy carries the template)."""
    exported = copy.copy(tokenizer)
    exported.chat_template = export_chat_template(getattr(tokenizer, "chat_template", None), reply_prefix)
    exported.save_pretrained(str(folder))


def export_policy(actor: ActorEngine, tokenizer: Any, folder: str | Path, reply_prefix: str = "") -> Path:
    """Write the policy and ``tokenizer`` as a Hugging Face folder at ``folder``, atomically replacing what is there
    (built in a hidden sibling, fsynced, renamed); its chat template ends the generation prompt with
    ``reply_prefix``, as :func:`save_checkpoint`'s export does. Call it on every rank under a launcher; rank 0
    writes. A LoRA engine's policy is its adapters: the folder is PEFT's adapter folder (``adapter_config.json``,
    ``adapter_model.safetensors``), which :func:`load_exported_weights` reads into a copy with the same adapters."""
    folder = Path(folder)
    state_dict = _full_state_dict(actor)
    if _rank() == 0:
        temp = folder.with_name(_TEMP_PREFIX + folder.name)
        shutil.rmtree(temp, ignore_errors=True)
        temp.parent.mkdir(parents=True, exist_ok=True)
        if actor.adapter:
            save_adapter(actor.module, temp, state_dict)
        else:
            actor.module.save_pretrained(str(temp), state_dict=state_dict)
        save_tokenizer(tokenizer, temp, reply_prefix)
        follow_umask(temp)  # transformers and PEFT write the weights 0600
        _fsync_tree(temp)
        _replace_dir(temp, folder)
    _barrier()
    return folder


def load_exported_weights(model: Any, folder: str | Path) -> None:
    """Copy the weights of a Hugging Face export (``*.safetensors`` in ``folder``) into ``model`` in place, on its
    device and in its dtype. Every parameter of ``model`` must be in the export (tied weights count once). A LoRA
    policy's export (an adapter folder) goes into a model wrapped with the same adapters, its base kept."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / ADAPTER_CONFIG).is_file() and is_adapted(model):
        load_adapter_weights(model, folder)
        return
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{str(folder)!r} holds no *.safetensors weights; is it a Hugging Face export?")
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    missing = [name for name, _ in model.named_parameters() if name not in state]
    if missing:
        raise CheckpointError(
            f"the export in {str(folder)!r} lacks {len(missing)} parameters of the model (e.g. {missing[0]}); it was "
            "written for another architecture"
        )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(state[name].to(device=parameter.device, dtype=parameter.dtype))


def _full_state_dict(actor: ActorEngine) -> dict[str, Any] | None:
    """The whole state dict for the export under ZeRO-3 (gathered from the partitions: on rank 0, None elsewhere);
    None otherwise, where ``save_pretrained`` reads the unpartitioned module itself."""
    if not actor.engine.zero_optimization_partition_weights():
        return None
    # DeepSpeed's gather, in the model's own dtype
    return actor.engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=actor.adapter)


def _info(
    run_id: str, iteration: int, actor: ActorEngine, critic: CriticEngine | None, extra: dict[str, Any]
) -> dict[str, Any]:
    """The content of ``checkpoint.json`` (PEFT's version: None where it is not installed, for a run without LoRA)."""
    from importlib.metadata import PackageNotFoundError, version

    import deepspeed
    import torch
    import transformers

    try:
        peft = version("peft")
    except PackageNotFoundError:
        peft = None
    info = {
        "format_version": FORMAT_VERSION,
        "run_id": run_id,
        "iteration": iteration,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "engine_tag": ENGINE_TAG,
        "has_critic": critic is not None,
        "actor_global_steps": int(actor.engine.global_steps),
        "critic_global_steps": int(critic.engine.global_steps) if critic is not None else None,
        "versions": {
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__,
            "peft": peft,
        },
        "extra": extra,
    }
    if actor.adapter:
        info["lora"] = adapter_settings(actor.module)
        info["base_model"] = {"sha256": actor.base_digest}
    return info


def _json_value(value: Any) -> Any:
    """numpy / torch scalars in ``extra`` become plain numbers; anything else is an error, not a silent string."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"checkpoint extra values must be JSON-serialisable; got {type(value).__name__}: {value!r}")


def _clean_leftovers(folder: Path) -> None:
    """Delete the hidden temporary and discarded folders a crashed save or prune left behind."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.name.startswith((_TEMP_PREFIX, TRASH_PREFIX)):
            shutil.rmtree(path, ignore_errors=True)


def _replace_dir(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``; an existing ``target`` is first moved aside, then deleted."""
    if target.exists():
        trash = target.with_name(TRASH_PREFIX + target.name)
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(target, trash)
        os.rename(source, target)
        shutil.rmtree(trash)
    else:
        os.rename(source, target)
    fsync_dir(target.parent)


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` to disk, so the rename publishes only durable data."""
    for current, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(current, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(Path(current))


# -- load --------------------------------------------------------------------------------------------------------
def load_checkpoint(path: str | Path, actor: ActorEngine, critic: CriticEngine | None = None) -> dict[str, Any]:
    """Restore the engines' exact state (weights, optimizer, lr scheduler, step counters); return the checkpoint's
    ``checkpoint.json``.

    The engines must be built with the same model shape and optimizer settings as the saved ones (a mismatch raises);
    a LoRA checkpoint, with the same adapters on the same base weights (its sha256), whose frozen weights the engine
    keeps as they are. A checkpoint with a critic may be loaded without one (actor only); the reverse raises a
    :class:`CheckpointError`.
    Every file of the engine folders loaded is checked against its recorded sha256 first, and the state files are
    read without running code (see the module's docstring); a damaged or foreign file is a :class:`CheckpointError`
    naming it (a digest mismatch is found before any engine is changed).
    """
    path = Path(path)
    info = read_checkpoint_info(path)
    _check_adapters(path, info, actor)
    engines: dict[str, ActorEngine | CriticEngine] = {CHECKPOINT_ACTOR: actor}
    if critic is not None:
        if not info.get("has_critic") or not checkpoint_file(path, CHECKPOINT_CRITIC).is_dir():
            raise CheckpointError(
                f"checkpoint {str(path)!r} has no critic state but a critic was given; it was saved by a run "
                "without a critic (e.g. GRPO): resume with the same algorithm settings, or pass critic=None"
            )
        engines[CHECKPOINT_CRITIC] = critic
    for role in engines:
        if not any(engine_state_dir(path, role).glob("*model_states.pt")):
            raise CheckpointError(
                f"checkpoint is incomplete: no {role} model state (*model_states.pt) in "
                f"{str(engine_state_dir(path, role))!r}"
            )
    _verify_files(path, info, tuple(engines))
    for role, owner in engines.items():
        _load_engine(owner, path, role)
    return info


def _verify_files(path: Path, info: dict[str, Any], roles: tuple[str, ...]) -> None:
    """Check the engine folders ``roles`` of the checkpoint against the digests of its ``checkpoint.json``."""
    if "files" in info:
        verify_digests(path, info["files"], roles)
    elif info.get("format_version", 1) != 1:  # the entry was removed: treat as tampering, not as an old save
        info_file = checkpoint_file(path, INFO_FILE)
        raise CheckpointError(f"{str(info_file)!r} is damaged: it lacks the 'files' digests of its version")
    else:
        LOG.warning(
            "checkpoint %s predates file digests (format_version 1): its files are loaded without running code "
            "from them, but not checked for damage; a new save of the run records digests",
            path,
        )


def _check_adapters(path: Path, info: dict[str, Any], actor: ActorEngine) -> None:
    """A LoRA checkpoint loads only into a LoRA engine with the same adapters on the same base weights, and a full
    one only into a full engine (a :class:`CheckpointError` before any engine is changed)."""
    saved = info.get("lora")
    if saved is None and not actor.adapter:
        return
    if saved is None or not actor.adapter:
        held = "LoRA adapters" if saved is not None else "a fully fine-tuned policy"
        engine = "a full fine-tuning engine" if saved is not None else "a LoRA engine"
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds {held} but was loaded into {engine}: resume with the run's own actor.lora"
        )
    own = adapter_settings(actor.module)
    if saved != own:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds adapters {saved}, the engine {own}: resume with the run's own actor.lora"
        )
    base = (info.get("base_model") or {}).get("sha256")
    if base != actor.base_digest:
        raise CheckpointError(
            f"the adapters of checkpoint {str(path)!r} were trained on another base model (sha256 of its weights "
            f"{base}, the engine's {actor.base_digest}): start from the run's own start model"
        )


def _adapter_load(src: dict[str, Any], dst: Any) -> None:
    """DeepSpeed's ``custom_load_fn`` for a LoRA actor: the state must hold exactly the engine's tensors but its frozen
    weights (the adapters and the buffers); they are loaded, the frozen base kept. A strict load, keyed to what
    :func:`save_checkpoint` leaves out."""
    frozen = {name for name, p in dst.named_parameters(remove_duplicate=False) if not p.requires_grad}
    what = key_mismatch(
        set(dst.state_dict()) - frozen, set(src), "tensors of the adapters", "the engine does not train"
    )
    if what:
        raise CheckpointError(
            f"the LoRA actor state {what}: it was saved with other adapters, or damaged; resume with the run's own "
            "actor.lora, or delete the checkpoint (a resume then starts from an earlier one)"
        )
    dst.load_state_dict(src, strict=False)


def _load_engine(owner: ActorEngine | CriticEngine, path: Path, role: str) -> None:
    """Load one engine's DeepSpeed state from the checkpoint folder ``path`` (explicit tag, never the ``latest``
    file), reading the state files without running code from them."""
    folder, state = checkpoint_file(path, role), engine_state_dir(path, role)
    adapters = isinstance(owner, ActorEngine) and owner.adapter
    with safe_engine_loading(owner.engine), _literal_folder(owner.engine):
        load_path, _ = owner.engine.load_checkpoint(
            str(folder),
            tag=ENGINE_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
            custom_load_fn=_adapter_load if adapters else None,
        )
    if load_path is None:
        raise CheckpointError(f"DeepSpeed could not load the {role} state in {str(state)!r}")


@contextmanager
def _literal_folder(engine: Any) -> Iterator[None]:
    """Within the block, DeepSpeed finds the model state files of a checkpoint in its folder taken literally.

    ``DeepSpeedEngine._get_all_ckpt_names`` globs ``<folder>/<tag>/mp_rank_*_model_states.pt`` with the folder as
    part of the pattern, so a data root named ``data[1]`` matched a sibling ``data1``'s files (or none); the folder
    is escaped here, and only the file name stays a pattern."""
    found = engine._get_all_ckpt_names
    engine._get_all_ckpt_names = lambda folder, tag: found(glob.escape(str(folder)), tag)
    try:
        yield
    finally:
        del engine._get_all_ckpt_names  # the instance attribute: the class's method shows again


# -- ranks -------------------------------------------------------------------------------------------------------
def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    """Wait for all ranks (a no-op in a world of one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
