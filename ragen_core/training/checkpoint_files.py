"""Reading checkpoint files without trusting them: sha256 digests and a loader that runs no code from a file.

A checkpoint lives in the data root, which users share; whoever can write there can plant or change files. Two
guards stand between such a file and our process:

- every file of a checkpoint has its sha256 recorded in ``checkpoint.json`` when it is saved; before a load,
  :func:`verify_digests` checks that the engine folders hold exactly those files with those digests (a damaged,
  swapped, missing or extra file is refused, named, before anything is read). The digests catch damage and stray
  files; someone who can rewrite ``checkpoint.json`` as well can make them match, which the second guard covers;
- DeepSpeed's state files are ``torch.save`` pickles. They are read only with ``torch.load(weights_only=True)``,
  whose unpickler builds tensors, plain containers and the few DeepSpeed types :func:`safe_globals` names, and
  refuses every other callable: a planted pickle cannot run code even with matching digests. DeepSpeed's own loader
  (``weights_only=False``) is replaced by a :func:`safe_checkpoint_engine` for the duration of a load
  (:func:`safe_engine_loading`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragen_core.storage.layout import CHECKPOINT_INFO, checkpoint_file

DIGEST_CHUNK = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing, incomplete, damaged, or does not fit the engines it is loaded into."""


# -- loading without running code --------------------------------------------------------------------------------
def safe_globals() -> list[Any]:
    """The non-torch types DeepSpeed's state files hold (ZeRO stage enum, loss scalers, optimizer slice addresses):
    plain data classes, whose unpickling sets attributes and calls nothing else."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def safe_torch_load(path: str | Path, map_location: Any = None) -> Any:
    """``torch.load`` of ``path`` that executes no code from it; a :class:`CheckpointError` naming the file when it
    is not a plain ``torch.save`` of tensors and allowed types (or is no such file at all)."""
    import torch

    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"refusing to load {str(path)!r}: it is not a checkpoint file this program wrote (damaged, or planted "
            f"by someone with write access to the data root; nothing in it was run): {_reason(exc)}"
        ) from exc


def _reason(exc: BaseException) -> str:
    """The informative part of a ``torch.load`` error. Torch's weights-only message advises retrying with
    ``weights_only=False`` or allow-listing the refused callable (exactly what must not be done here), so only what
    was refused is kept."""
    text = str(exc)
    refused = re.search(r"GLOBAL ([\w.]+)", text)
    if refused:
        return f"it refers to {refused.group(1)}, which a weights-only load does not allow"
    operand = re.search(r"Unsupported operand[^\n.]*", text)
    if operand:
        return f"not a tensor file ({operand.group(0).strip()})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(exc, pickle.UnpicklingError) or not lines:
        return f"not a tensor file ({type(exc).__name__})"
    return lines[0]


def safe_checkpoint_engine() -> Any:
    """A DeepSpeed checkpoint engine that saves like the default one and loads through :func:`safe_torch_load`."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    class SafeCheckpointEngine(TorchCheckpointEngine):
        """DeepSpeed's torch engine, with a load that executes no code from the file."""

        def load(self, path: str, map_location: Any = None) -> Any:
            return safe_torch_load(path, map_location=map_location)

    return SafeCheckpointEngine()


@contextmanager
def safe_engine_loading(engine: Any) -> Iterator[None]:
    """Within the block, DeepSpeed ``engine`` reads its state files through :func:`safe_torch_load`.

    ``DeepSpeedEngine.load_checkpoint`` reads every model and ZeRO optimizer file through the engine's
    ``checkpoint_engine`` attribute (set once, when the engine is built); it is swapped here and put back after, so
    saves keep the configured engine."""
    original = engine.checkpoint_engine
    engine.checkpoint_engine = safe_checkpoint_engine()
    try:
        yield
    finally:
        engine.checkpoint_engine = original


# -- digests -----------------------------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(DIGEST_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every file under ``folder`` (relative paths in ``skip`` excluded)."""
    return {name: file_sha256(folder / name) for name in _entries(folder, folder) if name not in skip}


def verify_digests(folder: Path, recorded: Any, under: tuple[str, ...]) -> None:
    """Check that the files below the sub-folders ``under`` of ``folder`` are exactly the ``recorded`` ones
    (``{relative posix path: sha256}``, from ``checkpoint.json``) with the same sha256; a :class:`CheckpointError`
    naming the first file that is not."""
    expected = {
        name: digest for name, digest in _checked_listing(folder, recorded).items() if name.split("/")[0] in under
    }
    present = {name for sub in under for name in _entries(folder / sub, folder)}
    for name in sorted(present - set(expected)):
        raise CheckpointError(
            f"{str(folder / name)!r} is not a file of this checkpoint (no sha256 recorded in {CHECKPOINT_INFO}): "
            "something else wrote into the checkpoint folder; remove it (or delete the checkpoint folder: a resume "
            "then starts from an earlier checkpoint)"
        )
    for name, digest in sorted(expected.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {str(path)!r} is missing: the checkpoint is damaged")
        if file_sha256(path) != digest:
            raise CheckpointError(
                f"checkpoint file {str(path)!r} does not match the sha256 recorded in {CHECKPOINT_INFO}: it "
                f"was damaged or changed after the save; delete the checkpoint folder {str(folder)!r} (a resume then "
                "starts from an earlier checkpoint)"
            )


def _checked_listing(folder: Path, recorded: Any) -> dict[str, str]:
    """``recorded`` when it is a ``{relative path inside the folder: hex sha256}`` mapping; a damaged or edited
    listing (a path leaving the folder, a digest that is none) is a :class:`CheckpointError`."""
    info = str(checkpoint_file(folder, CHECKPOINT_INFO))
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{info!r} is damaged: its 'files' entry is not a mapping of file names to sha256")
    for name, digest in recorded.items():
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise CheckpointError(f"{info!r} is damaged: {name!r} is not a path inside the checkpoint folder")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise CheckpointError(f"{info!r} is damaged: the sha256 of {name!r} is not 64 hex digits")
    return recorded


def _entries(top: Path, relative_to: Path) -> list[str]:
    """The relative posix paths of every entry under ``top`` that is not a real folder: files, links (to folders
    too: they are never followed) and anything else."""
    names = []
    for current, dirs, files in os.walk(top):
        links = [name for name in dirs if (Path(current) / name).is_symlink()]
        names += [(Path(current) / name).relative_to(relative_to).as_posix() for name in files + links]
    return sorted(names)
