"""The run layer is tested without Prefect: no module under tests/run imports Prefect, the flows or the tasks
(parsed, never imported), so its decisions are tested as the plain functions they are. The rule checks itself on a
planted module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_TESTS = ROOT / "tests" / "run"
FORBIDDEN = ("prefect", "flows", "tasks")


def orchestration_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of each import of Prefect, the flows or the tasks in ``tree``: ``import x``, ``from x
    import y``, and ``importlib.import_module("x")`` / ``__import__("x")`` with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.module and not node.level else []
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            names = [node.args[0].value]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in FORBIDDEN]
    return sorted(found)


def _dynamic_import(node: ast.Call) -> bool:
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    literal = bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    return name in ("import_module", "__import__") and literal


def test_the_run_layer_tests_never_import_prefect_the_flows_or_the_tasks():
    modules = sorted(RUN_TESTS.rglob("*.py"))
    assert len(modules) > 5  # the folder is where the rule looks
    offenders = [(str(p.relative_to(ROOT)), hit) for p in modules for hit in orchestration_imports(ast.parse(
        p.read_text(), filename=str(p)))]  # fmt: skip
    assert offenders == []


PLANTED = """
import importlib
import prefect.testing
from flows.train import train
from tasks import stages as t
from ragen_core.run import decisions
from . import helpers
import prefects_cousin


def later():
    from prefect import flow
    importlib.import_module("flows.evaluate")
    return __import__("tasks.offline")
"""


def test_the_rule_sees_each_shape_of_import():
    assert orchestration_imports(ast.parse(PLANTED)) == [
        (3, "prefect.testing"), (4, "flows.train"), (5, "tasks"), (12, "prefect"), (13, "flows.evaluate"),
        (14, "tasks.offline"),
    ]  # fmt: skip
