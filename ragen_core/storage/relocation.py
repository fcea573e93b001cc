"""A data root that moves: the folders a manifest names inside its data root are stored relative to it.

A data root is what a user copies to another machine or to a cluster's shared storage (``cp -a``, ``mv``, rsync).
The folders a run's manifest names (the model it starts from, a bootstrap's base model, an evaluated model, an
offline run's start model) mostly lie inside the root: the tiny default under ``models/``, a bootstrap's model, a
checkpoint's export under ``runs/<id>/checkpoints/``. :func:`stored_path` writes such a folder relative to the root
(``models/tiny-2c8f...``) and :func:`located_path` reads it back under the root the lake is opened at, so a copy
resumes, extends, evaluates, re-trains and removes its runs as the original does. A folder outside the root (a
user's own model) stays absolute.

Manifests written before this stored absolute paths. Read from a root that was copied or moved since, such a path
names the old root: when it runs through the old root's ``models/`` or ``runs/`` and the same place exists under the
new root, it is read there. A path read back is only a place: the commands still check that a folder a
manifest names lies inside the root or a trusted folder before loading anything from it
(:func:`ragen_core.config.trust.trusted_path`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ragen_core.storage import layout

# The manifest fields that name folders, as key paths into its JSON object.
PATH_FIELDS: tuple[tuple[str, ...], ...] = (
    ("model_dir",),
    ("base_model",),
    ("evaluated", "model_dir"),
    ("lineage", "init"),
)
ANCHORS = (layout.MODELS, layout.RUNS)  # the root's folders that hold models a manifest may name


def stored_path(path: str, root: Path) -> str:
    """``path`` as a manifest stores it: relative to ``root`` (POSIX form) when it lies inside it, else as given."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return path
    for inside, base in ((candidate, root.absolute()), (candidate.resolve(), root.resolve())):
        normal, folder = Path(os.path.normpath(inside)), Path(os.path.normpath(base))
        if normal.is_relative_to(folder):
            return normal.relative_to(folder).as_posix()
    return path


def located_path(text: str, root: Path) -> str:
    """A stored folder as a path on this machine: a relative one under ``root``; an absolute one that runs through
    ``models/`` or ``runs/`` of another data root (a manifest written before paths were stored relative, then
    copied or moved) at the same place under ``root`` when that exists; else as it is."""
    candidate, here = Path(text), root.absolute()
    if not candidate.is_absolute():
        return os.path.normpath(here / candidate)
    if Path(os.path.normpath(candidate)).is_relative_to(here):
        return text
    parts = candidate.parts
    for index, part in enumerate(parts):
        if part in ANCHORS and ".." not in parts[index:] and (moved := here.joinpath(*parts[index:])).exists():
            return str(moved)
    return text


def _rewrite(data: dict[str, Any], change: Any) -> dict[str, Any]:
    """``data`` (a manifest's JSON object) with ``change`` applied to each string of :data:`PATH_FIELDS`."""
    out = dict(data)
    for keys in PATH_FIELDS:
        holder = out
        for key in keys[:-1]:
            inner = holder.get(key)
            if not isinstance(inner, dict):
                break
            holder[key] = holder = dict(inner)
        else:
            value = holder.get(keys[-1])
            if isinstance(value, str) and value:
                holder[keys[-1]] = change(value)
    return out


def stored_form(data: dict[str, Any], root: Path) -> dict[str, Any]:
    """A manifest's JSON object as written to ``root``: its folders inside the root relative to it."""
    return _rewrite(data, lambda value: stored_path(value, root))


def located_form(data: Any, root: Path) -> Any:
    """A manifest's JSON object as read from ``root``: its folders as paths on this machine (anything that is not a
    JSON object is left for the manifest's check to refuse)."""
    return _rewrite(data, lambda value: located_path(value, root)) if isinstance(data, dict) else data
