"""The layers of the project, checked on the source itself (parsed, never imported): no import runs back up.

- ``ragen_cli`` (the ``ragen`` command line) sits above the Prefect flows: ``flows``, ``tasks``, ``schemas`` and
  ``ragen_core`` never import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BELOW_THE_CLI = ("ragen_core", "schemas", "tasks", "flows")


def _imports(tree: ast.Module) -> set[str]:
    """Every module name an import statement of the tree names (``from a import b`` gives ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def cli_imports(tree: ast.Module) -> list[str]:
    """The imports of ``ragen_cli`` in one module's tree."""
    return sorted(name for name in _imports(tree) if name == "ragen_cli" or name.startswith("ragen_cli."))


def test_nothing_below_the_cli_imports_it():
    """The command line starts flows, never the other way round: a flow (or the core under it) that needs something
    of ``ragen_cli`` takes it as an argument, or the thing moves down."""
    offenders = [
        (str(path.relative_to(ROOT)), name)
        for package in BELOW_THE_CLI
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in cli_imports(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert offenders == []


def test_the_cli_check_sees_a_flow_importing_the_cli():
    """The check above catches a planted violation in each import form (a check that cannot fail proves nothing)."""
    planted = ast.parse(
        "import ragen_cli.main\nfrom ragen_cli import interrupts\n"
        "def f():\n    from ragen_cli.common import fail\n"
        "import ragen_core.storage\nfrom flows import ui\n"
    )
    assert cli_imports(planted) == [
        "ragen_cli",
        "ragen_cli.common",
        "ragen_cli.common.fail",
        "ragen_cli.interrupts",
        "ragen_cli.main",
    ]
