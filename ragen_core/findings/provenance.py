"""Where a finding's numbers came from: the commit of the code that ran (and whether the tree held uncommitted
changes) and the versions of the libraries that decide the numbers, written into the finding's JSON."""

from __future__ import annotations

import hashlib
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


# Modules of ragen_core that move, store or show numbers without deciding them: the lake, the trackers and plots,
# the finding figures, the run's entry (its lock), its record (the manifest) and the exported chat; and those that
# decide when and where a run goes on without deciding what it computes: the start decisions and the resume (a
# resumed run equals the uninterrupted one bit for bit: tests/flows hold it) and the sweep plans (whose resolved
# configs the findings' digests cover). Every other module counts in :func:`code_fingerprint` (a new module counts
# unless it is listed here).
PLUMBING = (
    "ragen_core/__init__.py",  # the package's exports
    "ragen_core/api.py",  # the Python API: builds requests, calls the run layer's procedures
    "ragen_core/findings/provenance.py",  # this list and the versions recorded
    "ragen_core/run/procedures.py",  # a command's course through the run layer (held: a run equals the flow's)
    "ragen_core/run/requests.py",  # a command's typed request, built once by whichever door
    "ragen_core/storage/",
    "ragen_core/run/decisions.py",
    "ragen_core/run/resume.py",
    "ragen_core/sweep.py",
    "ragen_core/monitor/trackers/",
    "ragen_core/monitor/plots.py",
    "ragen_core/monitor/tensorboard_sink.py",
    "ragen_core/findings/figures.py",
    "ragen_core/run/entry.py",
    "ragen_core/run/record.py",
    "ragen_core/run/chat.py",
)


def code_fingerprint(root: Path) -> str:
    """A short hash of the code that decides a run's numbers: every ``ragen_core`` source file (path and bytes) but
    :data:`PLUMBING`'s. Two checkouts with the same fingerprint run a finding the same way; a change to an env, a
    prompt, a loss, the sampler, a stage or an analysis gives another fingerprint (the findings' digests follow it)."""
    digest = hashlib.sha256()
    package = root / "ragen_core"
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if "__pycache__" in name or name.startswith(PLUMBING):
            continue
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def provenance(root: Path) -> dict[str, Any]:
    """The code version (:func:`code_version` and :func:`code_fingerprint`) and the library versions
    (:func:`library_versions`)."""
    return {"code": {**code_version(root), "fingerprint": code_fingerprint(root)}, "versions": library_versions()}


__all__ = ["DISTRIBUTIONS", "PLUMBING", "code_fingerprint", "code_version", "library_versions", "provenance"]
