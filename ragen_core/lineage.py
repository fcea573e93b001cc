"""Which code made a result: the fingerprint of the code that decides a run's numbers, and the chain of re-stamp
records that vouches two fingerprints give the same numbers.

A finding's JSON names the fingerprint of the code that made it (:mod:`ragen_core.findings.provenance`); a cached
bootstrap is keyed by its code's :func:`lineage_root` (:mod:`ragen_core.run.bootstrap`), so a bootstrap that older
code trained is reused only when a chain of re-stamp records (``docs/findings/restamps/``, written by
``ragen reproduce --restamp``) links that code to this one. It imports nothing of the project: every layer may use it.
Plumbing (in :data:`PLUMBING`): it decides no number.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import tokenize
from pathlib import Path
from typing import Any

# Modules of ragen_core that move, store or show numbers without deciding them: the lake, the trackers and plots,
# the finding figures, the run's entry (its lock), its record (the manifest) and the exported chat; and those that
# decide when and where a run goes on without deciding what it computes: the start decisions and the resume (a
# resumed run equals the uninterrupted one bit for bit: tests/flows hold it) and the sweep plans (whose resolved
# configs the findings' digests cover). Every other module counts in :func:`code_fingerprint` (a new module counts
# unless it is listed here).
PLUMBING = (
    "ragen_core/__init__.py",  # the package's exports
    "ragen_core/api.py",  # the Python API: builds requests, calls the run layer's procedures
    "ragen_core/lineage.py",  # this list, the fingerprint and the chain of re-stamp records
    "ragen_core/findings/provenance.py",  # the versions and the machine a finding records
    "ragen_core/findings/restamp.py",  # the probe that runs two commits side by side, and its records
    "ragen_core/findings/restamp_sides.py",  # the probe's two sides: each commit's tree and its runs
    "ragen_core/findings/bitwise.py",  # the probe's comparison of two lakes
    "ragen_core/findings/changes.py",  # which counted files a change touched, and whether the probe ran them
    "ragen_core/findings/restamp_records.py",  # the re-stamp records and their chain
    "ragen_core/run/procedures.py",  # a command's course through the run layer (held: a run equals the flow's)
    "ragen_core/run/requests.py",  # a command's typed request, built once by whichever door
    "ragen_core/run/inputs.py",  # what a user gives each command, one model per command
    "ragen_core/storage/",
    "ragen_core/run/decisions.py",
    "ragen_core/run/resume.py",
    "ragen_core/sweep/",  # the sweep package: plans, their store and comparison, the request and course
    "ragen_core/sweep.py",  # the same, a module until issue 67: an older checkout's (a re-stamp's old side)
    "ragen_core/monitor/trackers/",
    "ragen_core/monitor/plots.py",
    "ragen_core/monitor/tensorboard_sink.py",
    "ragen_core/findings/figures.py",
    "ragen_core/run/entry.py",
    "ragen_core/run/record.py",
    "ragen_core/run/chat.py",
    "ragen_core/stops.py",  # the record that the process was asked to stop
    # another node's `ragen group join`: its arguments, signals and log (the ranks it starts run the counted
    # training/worker.py, numbered by the counted training/group.py's torchrun command)
    "ragen_core/training/nodes.py",
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


RECORDS = Path("docs") / "findings" / "restamps"  # the records, relative to the repository's root


def records(repo: Path) -> list[dict[str, Any]]:
    """The committed re-stamp records, oldest first."""
    folder = repo / RECORDS
    found = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted(found, key=lambda r: r["date"])


def reaches(start: str, target: str, repo: Path) -> list[dict[str, Any]] | None:
    """The chain of records that links fingerprint ``start`` to ``target`` (empty when they are equal), or None."""
    edges: dict[str, list[dict[str, Any]]] = {}
    for record in records(repo):
        edges.setdefault(record["from"]["fingerprint"], []).append(record)
    chains: list[tuple[str, list[dict[str, Any]]]] = [(start, [])]
    seen = {start}
    while chains:
        here, chain = chains.pop(0)
        if here == target:
            return chain
        for record in edges.get(here, []):
            there = record["to"]["fingerprint"]
            if there not in seen:
                seen.add(there)
                chains.append((there, [*chain, record]))
    return None


def package_root() -> Path:
    """The folder holding the ``ragen_core`` package in use (a checkout's root, or the installed site-packages)."""
    return Path(__file__).resolve().parent.parent


_ROOTS: dict[tuple[str, str], str] = {}  # (root, fingerprint) -> its lineage root, read once per code


def lineage_root(root: Path | None = None) -> str:
    """The fingerprint of the oldest code that the re-stamp records under ``root`` (default :func:`package_root`)
    link to this code's :func:`code_fingerprint` by a chain (this code's own when none does: a change not yet
    re-stamped, an installed package without the records). Two codes of one lineage made the same rows for every
    point and probe path of the findings, so what one built (a bootstrap) stands for the other's."""
    root = root or package_root()
    here = code_fingerprint(root)
    key = (str(root), here)
    if key not in _ROOTS:
        earlier = {r["to"]["fingerprint"]: r["from"]["fingerprint"] for r in records(root)}
        oldest, seen = here, {here}
        while oldest in earlier and earlier[oldest] not in seen:
            oldest = earlier[oldest]
            seen.add(oldest)
        _ROOTS[key] = oldest
    return _ROOTS[key]


__all__ = [
    "PLUMBING",
    "RECORDS",
    "code_fingerprint",
    "code_form",
    "lineage_root",
    "package_root",
    "reaches",
    "records",
]
