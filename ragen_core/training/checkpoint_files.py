"""Reading checkpoint files without trusting them: sha256 digests and a pickle-free-of-code loader.

A checkpoint lives in the data root, which users share; whoever can write there can plant or change files. Two
guards stand between such a file and our process:

- every file of a checkpoint has its sha256 recorded in ``checkpoint.json`` when it is saved; a load first checks
  that the engine folders hold exactly those files with those digests (a damaged, swapped or extra file is refused,
  named, before anything is read);
- DeepSpeed's state files are ``torch.save`` pickles. They are read only with ``torch.load(weights_only=True)``,
  whose unpickler builds tensors, plain containers and the few DeepSpeed types named in :data:`SAFE_GLOBALS`, and
  refuses every other callable: a planted pickle cannot run code even with matching digests. DeepSpeed's own loader
  (``weights_only=False``) is replaced by :class:`SafeCheckpointEngine` for the duration of a load.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

DIGEST_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing, incomplete, damaged, or does not fit the engines it is loaded into."""


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
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError, KeyError, TypeError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"refusing to load {str(path)!r}: it is not a checkpoint file this program wrote (damaged, or planted "
            f"by someone with write access to the data root): {first_line}"
        ) from exc


def safe_checkpoint_engine() -> Any:
    """A DeepSpeed checkpoint engine that saves like the default one and loads through :func:`safe_torch_load`."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    class SafeCheckpointEngine(TorchCheckpointEngine):
        """DeepSpeed's torch engine, with a load that executes no code from the file."""

        def load(self, path: str, map_location: Any = None) -> Any:
            return safe_torch_load(path, map_location=map_location)

    return SafeCheckpointEngine()


# -- digests -----------------------------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(DIGEST_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tree_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every file under ``folder`` (names in ``skip`` at the top excluded)."""
    found = {}
    for current, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(current) / name
            relative = path.relative_to(folder).as_posix()
            if relative not in skip:
                found[relative] = file_sha256(path)
    return found


def verify_digests(folder: Path, recorded: dict[str, str], under: tuple[str, ...]) -> None:
    """Check that the files below the sub-folders ``under`` of ``folder`` are exactly the ``recorded`` ones, with
    the same sha256; a :class:`CheckpointError` naming the first file that is not."""
    expected = {name: digest for name, digest in recorded.items() if name.split("/", 1)[0] in under}
    present: set[str] = set()
    for sub in under:
        if (folder / sub).exists():
            present |= {name for name in tree_digests_names(folder, sub)}
    for name in sorted(present - set(expected)):
        raise CheckpointError(
            f"{str(folder / name)!r} is not a file of this checkpoint (no digest recorded in checkpoint.json): "
            "something else wrote into the checkpoint folder; remove the file, or resume from another checkpoint"
        )
    for name, digest in sorted(expected.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {str(path)!r} is missing: the checkpoint is damaged")
        if file_sha256(path) != digest:
            raise CheckpointError(
                f"checkpoint file {str(path)!r} does not match the sha256 recorded in checkpoint.json: it was "
                "damaged or changed after the save; resume from another checkpoint (or delete this one)"
            )


def tree_digests_names(folder: Path, sub: str) -> list[str]:
    """The relative posix paths of every file (or link, or other entry that is not a folder) under ``folder/sub``."""
    names = []
    for current, _, files in os.walk(folder / sub):
        names += [(Path(current) / name).relative_to(folder).as_posix() for name in files]
    return names
