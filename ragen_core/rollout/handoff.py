"""Handing new weights to a copy of the policy in another process through shared memory, not a Hugging Face export.

Two hand-offs use it, both into the rollout side. A launched update group (:mod:`ragen_core.training.group`) hands
the run's process its new weights after every update: writing a Hugging Face folder (``save_pretrained``, tokenizer,
fsync, rename) and reading it back (safetensors, copy) costs two full passes through the file system per update (on
one H100 it made the launched update 4.2x the in-process one at a 0.47B model). And the run's process hands an async
run's sampler process (:mod:`ragen_core.rollout.sampler`) the policy it samples the next batch with. Instead of a
folder, the writer keeps one flat buffer of the policy's weights in a shared-memory file (``/dev/shm``, else the
system's temporary folder), mapped by both processes: it copies the weights in (one memory copy; from a GPU one
device-to-host copy), and the reader copies them out into its model (one host copy, or one host-to-device copy). The
bytes are the module's own, so the copy equals the writer's exactly, as after an export. Exports to disk remain at
checkpoints (their ``hf/`` folder), on a restore, and after every update when the rollout side needs a folder (a
vLLM server reloads one).

A LoRA policy (``actor.lora``) hands over its adapters only (a layout of the trainable parameters,
``trainable_only``): megabytes, not the model. Its frozen base never changes in a run, so the copy gets it once, when
the copy is made.

The file is created by the writer (readable by this user only), mapped by the reader and then unlinked at once: the
memory lives as long as either mapping, and nothing is left behind when either process dies.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ragen_core.policy.lora import is_adapted

ALIGN = 64  # bytes: every tensor starts on a cache line (and on its dtype's alignment)
SHM_FOLDER = Path("/dev/shm")


@dataclass(frozen=True)
class WeightEntry:
    """Where one parameter lies in the flat buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the ``torch.`` prefix
    offset: int  # bytes from the buffer's start

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True)
class WeightLayout:
    """The parameters of a module (tied ones once, in ``named_parameters`` order) laid out in one flat buffer: all of
    them, or with ``trainable_only`` those that require gradients (a LoRA policy's adapters)."""

    entries: tuple[WeightEntry, ...]
    nbytes: int
    trainable_only: bool = False

    @classmethod
    def of_module(cls, module: torch.nn.Module, trainable_only: bool | None = None) -> WeightLayout:
        """The layout of ``module``'s parameters, or of its trainable ones (their full shapes also where ZeRO-3
        partitions them). By default, what a hand-off carries: the trainable ones of a LoRA policy (a PEFT wrap,
        whose frozen base never changes in a run), every one of any other module."""
        if trainable_only is None:
            trainable_only = is_adapted(module)
        entries, offset = [], 0
        for name, parameter in module.named_parameters():
            if trainable_only and not parameter.requires_grad:
                continue
            shape = tuple(getattr(parameter, "ds_shape", None) or parameter.shape)  # ZeRO-3 keeps the full shape
            entry = WeightEntry(name, shape, str(parameter.dtype).removeprefix("torch."), offset)
            entries.append(entry)
            offset += -(-entry.nbytes // ALIGN) * ALIGN
        return cls(tuple(entries), offset, trainable_only)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (sent over the group's control channel)."""
        entries = [[e.name, list(e.shape), e.dtype, e.offset] for e in self.entries]
        return {"nbytes": self.nbytes, "entries": entries, "trainable_only": self.trainable_only}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WeightLayout:
        """The inverse of :meth:`to_json`."""
        entries = tuple(
            WeightEntry(str(n), tuple(int(s) for s in shape), str(d), int(o)) for n, shape, d, o in data["entries"]
        )
        return cls(entries, int(data["nbytes"]), bool(data.get("trainable_only", False)))

    def check_matches(self, module: torch.nn.Module) -> None:
        """Raise ``ValueError`` naming the first difference when ``module``'s parameters (its trainable ones, for a
        ``trainable_only`` layout) are not this layout's (names and shapes; a dtype may differ, the copy converts
        it)."""
        own = [(e.name, e.shape) for e in WeightLayout.of_module(module, self.trainable_only).entries]
        theirs = [(e.name, e.shape) for e in self.entries]
        if own != theirs:
            mismatch = next((a for a, b in zip(own, theirs, strict=False) if a != b), (own + theirs)[-1])
            raise ValueError(
                f"the shared weights do not fit the rollout model (first difference: {mismatch[0]}); the update "
                "group and the rollout side must load the same model"
            )


class SharedWeights:
    """A module's weights in a flat buffer mapped from a shared-memory file."""

    def __init__(self, path: Path, layout: WeightLayout, buffer: torch.Tensor) -> None:
        self.path, self.layout, self.buffer = path, layout, buffer
        self._views = {entry.name: self._view(entry) for entry in layout.entries}

    @classmethod
    def create(cls, layout: WeightLayout, folder: Path | None = None) -> SharedWeights:
        """A new, zeroed shared file for ``layout`` (mode 0600), mapped: in ``folder``, or in /dev/shm, else (when
        /dev/shm is missing or too small, as a container's default 64 MB) in the temporary folder. The space is
        reserved up front, so a full file system is an ``OSError`` here rather than a SIGBUS at the first write."""
        folders = [folder] if folder else [SHM_FOLDER, Path(tempfile.gettempdir())]
        error: OSError | None = None
        for candidate in folders:
            if not candidate.is_dir() or not os.access(candidate, os.W_OK):
                continue
            path = candidate / f"ragen-weights-{os.getpid()}-{secrets.token_hex(8)}"
            try:
                _reserve(path, max(layout.nbytes, 1))
            except OSError as exc:
                path.unlink(missing_ok=True)
                error = exc
                continue
            return cls(path, layout, _map(path, layout.nbytes))
        places = ", ".join(map(str, folders))
        raise OSError(f"no room for {layout.nbytes} bytes of shared weights in {places}: {error or 'not writable'}")

    @classmethod
    def attach(cls, path: str | Path, layout: WeightLayout) -> SharedWeights:
        """Map an existing shared file of ``layout`` (written by another process)."""
        path = Path(path)
        size = path.stat().st_size
        if size < layout.nbytes:
            raise ValueError(f"shared weights file {str(path)!r} holds {size} bytes; its layout needs {layout.nbytes}")
        return cls(path, layout, _map(path, layout.nbytes))

    def _view(self, entry: WeightEntry) -> torch.Tensor:
        raw = self.buffer[entry.offset : entry.offset + entry.nbytes]
        return raw.view(getattr(torch, entry.dtype)).view(entry.shape)

    @torch.no_grad()
    def write(self, parameters: dict[str, torch.Tensor]) -> None:
        """Copy ``parameters`` (name -> full tensor, e.g. ``dict(module.named_parameters())``) into the buffer."""
        for name, view in self._views.items():
            view.copy_(parameters[name].detach())

    @torch.no_grad()
    def read_into(self, module: torch.nn.Module) -> None:
        """Copy the buffer into ``module``'s parameters in place (on their device; the layout is checked first): all
        of them, or the trainable ones of a ``trainable_only`` layout, the others left as they are."""
        self.layout.check_matches(module)
        parameters = dict(module.named_parameters())
        for name, view in self._views.items():
            parameters[name].copy_(view, non_blocking=False)

    def unlink(self) -> None:
        """Remove the file's name (the mappings stay valid until both processes drop them)."""
        self.path.unlink(missing_ok=True)


def _reserve(path: Path, nbytes: int) -> None:
    """Create ``path`` (mode 0600, not there before) with ``nbytes`` allocated."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(descriptor, 0, nbytes)
        else:  # no fallocate (macOS): a sparse file
            os.ftruncate(descriptor, nbytes)
    finally:
        os.close(descriptor)


def _map(path: Path, nbytes: int) -> torch.Tensor:
    """The file's first ``nbytes`` bytes as a uint8 tensor over a shared mapping (writes reach the other process)."""
    return torch.from_file(str(path), shared=True, size=max(nbytes, 1), dtype=torch.uint8)
