"""Where a finding's numbers came from: the commit of the code that ran (and whether the tree held uncommitted
changes) and the versions of the libraries that decide the numbers, written into the finding's JSON."""

from __future__ import annotations

import ast
import hashlib
import io
import platform
import subprocess
import tokenize
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
    "ragen_core/findings/restamp.py",  # the probe that runs two commits side by side, and its records
    "ragen_core/findings/bitwise.py",  # the probe's comparison of two lakes
    "ragen_core/findings/restamp_records.py",  # the re-stamp records and their chain
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
    """A short hash of the code that decides a run's numbers: every ``ragen_core`` source file but :data:`PLUMBING`'s,
    each as its path and :func:`code_form` (its source without docstrings, comments and blank lines). Two checkouts
    with the same fingerprint run a finding the same way; a change to an env, a prompt, a loss, the sampler, a stage
    or an analysis gives another fingerprint (the findings' digests follow it), a docstring or a comment does not."""
    digest = hashlib.sha256()
    package = root / "ragen_core"
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if "__pycache__" in name or name.startswith(PLUMBING):
            continue
        digest.update(name.encode() + b"\0" + _form_digest(path) + b"\0")
    return digest.hexdigest()[:16]


_FORMS: dict[tuple[str, int, int], bytes] = {}  # (path, mtime, size) -> digest of its code form: parsed once


def _form_digest(path: Path) -> bytes:
    """The SHA-256 of the file's :func:`code_form`, remembered while the file stays as it is."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _FORMS:
        _FORMS[key] = hashlib.sha256(code_form(path.read_text()).encode()).digest()
    return _FORMS[key]


def code_form(source: str) -> str:
    """What of a module's source decides what it computes: the source without its docstrings (of the module, a class
    or a function) and comments, each line without trailing blanks and blank lines dropped. Every other string,
    name, constant and the indentation stay; it reads the same on every Python version (positions from the syntax
    tree, comments from the tokenizer, none of their version-dependent dumps)."""
    # the lines as the parser and the tokenizer count them: ends of line only (str.splitlines would also cut at a
    # form feed, which Python allows inside a line, and shift every position after it)
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    lines = source.split("\n")
    cut: dict[int, list[tuple[int, int]]] = {}  # line index -> (start column, end column) spans to blank
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if docstring and isinstance(first.value.value, str):
                start = (first.lineno, _column(lines, first.lineno, first.col_offset))
                _blank(cut, lines, start, (first.end_lineno, _column(lines, first.end_lineno, first.end_col_offset)))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            _blank(cut, lines, token.start, token.end)
    kept = []
    for index, line in enumerate(lines):
        for start, end in sorted(cut.get(index, []), reverse=True):
            line = line[:start] + " " * (end - start) + line[end:]
        if line.strip():
            kept.append(line.rstrip())
    return "\n".join(kept)


def _column(lines: list[str], number: int, offset: int) -> int:
    """The character column of the syntax tree's UTF-8 byte ``offset`` on line ``number`` (1-based)."""
    return len(lines[number - 1].encode()[:offset].decode(errors="ignore"))


Position = tuple[int, int]  # (line, character column), lines 1-based


def _blank(cut: dict[int, list[tuple[int, int]]], lines: list[str], start: Position, end: Position) -> None:
    """Mark the span from ``start`` to ``end`` to be blanked."""
    for number in range(start[0], end[0] + 1):
        begin = start[1] if number == start[0] else 0
        stop = end[1] if number == end[0] else len(lines[number - 1])
        cut.setdefault(number - 1, []).append((begin, stop))


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
