"""Which counted files two checkouts differ in, whether the change is only of form, and whether a probe ran it.

A re-stamp (:mod:`ragen_core.findings.restamp`) vouches for a change only where its probe ran the changed code: a
changed counted file must have a changed statement executed. A file whose syntax tree is unchanged (a reformat: line
breaks, quotes, parentheses, trailing commas; docstrings aside) computes what it computed before whatever ran, so it
needs none. Plumbing (:data:`ragen_core.lineage.PLUMBING`): nothing here decides a number.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from ragen_core.lineage import PLUMBING, code_form


def counted(name: str) -> bool:
    """A path (relative, posix) that :func:`ragen_core.lineage.code_fingerprint` counts."""
    return name.startswith("ragen_core/") and name.endswith(".py") and not name.startswith(PLUMBING)


def changed_counted_files(old: Path, new: Path) -> dict[str, list[int] | None]:
    """Counted files whose code form differs between the trees: path -> the new side's changed line numbers (those
    ``git diff`` adds), or None for a file the new side removed."""
    names = {p.relative_to(t).as_posix() for t in (old, new) for p in (t / "ragen_core").rglob("*.py")}
    changed: dict[str, list[int] | None] = {}
    for name in sorted(n for n in names if counted(n) and "__pycache__" not in n):
        a, b = old / name, new / name
        if not b.exists():
            changed[name] = None
        elif not a.exists() or code_form(a.read_text()) != code_form(b.read_text()):
            changed[name] = _added_lines(a if a.exists() else None, b)
    return changed


def same_syntax(old: str, new: str) -> bool:
    """Whether two module sources parse to the same syntax tree once docstrings are dropped: the same program
    written in another layout. Positions are left out of the comparison; every name, constant and operator stays."""
    return _syntax(old) == _syntax(new)


def _syntax(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:]
    return ast.dump(tree, include_attributes=False)


def reformatted(changed: dict[str, list[int] | None], old: Path, new: Path) -> list[str]:
    """The changed files (of :func:`changed_counted_files`) that only changed form: :func:`same_syntax` on both
    sides."""
    return sorted(
        name
        for name, lines in changed.items()
        if lines is not None
        and (old / name).exists()
        and same_syntax((old / name).read_text(), (new / name).read_text())
    )


def _added_lines(old: Path | None, new: Path) -> list[int]:
    """The line numbers of ``new`` that ``git diff --no-index`` adds to ``old`` (all of them for a new file)."""
    if old is None:
        return list(range(1, len(new.read_text().splitlines()) + 1))
    done = subprocess.run(["git", "diff", "--no-index", "-U0", str(old), str(new)], capture_output=True, text=True)
    lines = []
    for match in re.finditer(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", done.stdout, re.M):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        lines += range(start, start + count)
    return lines


def executed_lines(coverage_file: Path, tree: Path) -> dict[str, set[int]]:
    """path (relative to ``tree``) -> the lines the probe executed there, from coverage.py's data file."""
    from coverage import CoverageData

    data = CoverageData(basename=str(coverage_file))
    data.read()
    executed = {}
    for path in data.measured_files():
        resolved = Path(path).resolve()
        if resolved.is_relative_to(tree.resolve()):
            executed[resolved.relative_to(tree.resolve()).as_posix()] = set(data.lines(path) or ())
    return executed


def unexercised(
    changed: dict[str, list[int] | None], executed: dict[str, set[int]], tree: Path, same: list[str] = ()
) -> dict[str, str]:
    """The changed counted files the probe did not exercise, each with why. A changed line counts as the statement
    it belongs to (a default inside a multi-line signature is its ``def``, run when the module is imported); a file
    must have one such statement executed, or, where its change holds no statement (lines removed only), any line.
    A removed file needs nothing, nor does one in ``same`` (its syntax unchanged: :func:`reformatted`)."""
    from coverage.python import PythonParser

    missing = {}
    for name, lines in changed.items():
        if lines is None or name in same:
            continue
        ran = executed.get(name, set())
        parser = PythonParser(text=(tree / name).read_text())
        parser.parse_source()
        statements = {parser.first_line(line) for line in lines} & parser.statements
        if not ran:
            missing[name] = "no line of it ran"
        elif statements and not ran & statements:
            missing[name] = f"none of its {len(statements)} changed statement(s) ran"
    return missing


__all__ = ["changed_counted_files", "counted", "executed_lines", "reformatted", "same_syntax", "unexercised"]
