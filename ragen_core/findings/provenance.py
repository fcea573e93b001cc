"""Where a finding's numbers came from: the commit of the code that ran (and whether the tree held uncommitted
changes) and the versions of the libraries that decide the numbers, written into the finding's JSON."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from ragen_core.lineage import PLUMBING, code_fingerprint, code_form

# The distributions whose versions can change a finding's numbers (kernels, tokenizers, samplers, the engine).
DISTRIBUTIONS = ("torch", "transformers", "deepspeed", "numpy", "tokenizers", "pyarrow", "duckdb", "prefect", "peft")


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


def machine() -> dict[str, Any]:
    """The machine kind a finding's numbers are bitwise on: the CPU's model, torch's CPU capability (the instruction
    set its kernels use: ``AVX2``, ``AVX512``, ...), torch's threads and the cores. Other kinds give other roundings
    (docs/findings.md, "Why one machine")."""
    import os

    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "model": model,
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
    }


def provenance(root: Path) -> dict[str, Any]:
    """The code version (:func:`code_version` and :func:`code_fingerprint`) and the library versions
    (:func:`library_versions`)."""
    return {"code": {**code_version(root), "fingerprint": code_fingerprint(root)}, "versions": library_versions()}


__all__ = [
    "DISTRIBUTIONS",
    "PLUMBING",
    "code_fingerprint",
    "code_form",
    "code_version",
    "library_versions",
    "machine",
    "provenance",
]
