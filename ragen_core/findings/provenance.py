"""Where a finding's numbers came from: the commit of the code that ran (and whether the tree held uncommitted
changes) and the versions of the libraries that decide the numbers, written into the finding's JSON."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

# The distributions whose versions can change a finding's numbers (kernels, tokenizers, samplers, the engine).
DISTRIBUTIONS = ("torch", "transformers", "deepspeed", "numpy", "tokenizers", "pyarrow", "duckdb", "prefect")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version(root: Path) -> dict[str, Any]:
    """``{"commit": <HEAD's hash>, "dirty": <tracked files changed>}`` of the checkout at ``root``; both None when
    it is not a git checkout (an installed package)."""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(_git(root, "status", "--porcelain", "--untracked-files=no"))}


def library_versions() -> dict[str, str | None]:
    """Python's version and each of :data:`DISTRIBUTIONS`' installed version (None where it is not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(root: Path) -> dict[str, Any]:
    """The code version (:func:`code_version`) and the library versions (:func:`library_versions`)."""
    return {"code": code_version(root), "versions": library_versions()}


__all__ = ["DISTRIBUTIONS", "code_version", "library_versions", "provenance"]
