"""The run layer's rules, checked on the source (parsed, never imported), each on a planted module too:

- it is tested without Prefect: no module under tests/run imports Prefect, the flows or the tasks;
- one entry for a run: outside storage, only ``ragen_core/run/entry.py`` (``open_run``) takes a run's writer lock
  (``acquire`` / ``run_writer`` of ``ragen_core.storage.locks``); train, retrain, evaluate, the CLI and the bootstrap
  open their run through ``open_run``.
"""

from __future__ import annotations

import ast

from tests.test_architecture import ROOT

RUN_TESTS = ROOT / "tests" / "run"
FORBIDDEN = ("prefect", "flows", "tasks")
LOCKS = "ragen_core.storage.locks"
LOCK_TAKERS = ("acquire", "run_writer")
ENTRY = {"ragen_core/run/entry.py"}


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
    offenders = [
        (str(p.relative_to(ROOT)), hit)
        for p in modules
        for hit in orchestration_imports(ast.parse(p.read_text(), filename=str(p)))
    ]
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
        (3, "prefect.testing"),
        (4, "flows.train"),
        (5, "tasks"),
        (12, "prefect"),
        (13, "flows.evaluate"),
        (14, "tasks.offline"),
    ]


def lock_takes(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each way ``tree`` reaches the functions that take a writer lock: ``from
    ragen_core.storage.locks import acquire`` (or ``run_writer``), ``import ragen_core.storage.locks`` and ``from
    ragen_core.storage import locks`` (the module, whose functions it may then call)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == LOCKS:
            found += [(node.lineno, alias.name) for alias in node.names if alias.name in LOCK_TAKERS]
        elif isinstance(node, ast.ImportFrom) and node.module == "ragen_core.storage":
            found += [(node.lineno, "locks") for alias in node.names if alias.name == "locks"]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name == LOCKS]
    return sorted(found)


def test_a_run_s_writer_lock_is_taken_only_through_the_one_entry():
    folders = ("ragen_core", "flows", "tasks", "ragen_cli")
    modules = sorted(p for folder in folders if (ROOT / folder).is_dir() for p in (ROOT / folder).rglob("*.py"))
    offenders = [
        (rel, hit)
        for p in modules
        if not (rel := p.relative_to(ROOT).as_posix()).startswith("ragen_core/storage/") and rel not in ENTRY
        for hit in lock_takes(ast.parse(p.read_text(), filename=str(p)))
    ]
    assert offenders == []
    takers = {p: lock_takes(ast.parse((ROOT / p).read_text())) for p in sorted(ENTRY)}
    assert all(takers.values()), takers  # the exempt modules do take it (else the exemption is stale)


PLANTED_LOCKS = """
from ragen_core.storage.locks import RunLockedError, acquire, release
from ragen_core.storage.locks import run_writer as hold
import ragen_core.storage.locks
from ragen_core.storage import DataLake, locks
from ragen_core.storage.locks import check_not_held
"""


def test_the_entry_rule_sees_each_way_to_the_lock():
    assert lock_takes(ast.parse(PLANTED_LOCKS)) == [
        (2, "acquire"),
        (3, "run_writer"),
        (4, "ragen_core.storage.locks"),
        (5, "locks"),
    ]
