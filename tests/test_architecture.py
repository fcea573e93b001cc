"""The package shape docs/architecture.md draws, checked on the source itself (parsed, never imported).

- the core never imports Prefect;
- the lower packages never import the run layer (``ragen_core.run``);
- outside ``ragen_core/storage`` no code spells a lake file name, marker or top-level folder;
- tasks are thin: each task's name is the name of the core function it calls;
- no function is longer than 60 lines in ragen_core/, flows/, tasks/ and schemas/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOWER = ("agent", "algos", "envs", "policy", "rollout", "storage", "training")
LAKE_TOKENS = ("_DONE", "_commits", "_staging", "_locks", "_COMPACTION", "iteration=", "run_id=", "part-",
               "manifest.json", "checkpoint.json", "iteration-", ".compaction.json", "_layout.json")  # fmt: skip
LAKE_FOLDERS = {"runs", "checkpoints", "models", "quarantine", "update_group", "_staging", "_commits", "_locks",
                "sweeps", "_prefect"}  # fmt: skip
MAX_LINES = 60


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_the_core_never_imports_prefect():
    offenders = [
        (str(p.relative_to(ROOT)), name)
        for p in _modules("ragen_core", "schemas")
        for name in _imports(_tree(p))
        if name == "prefect" or name.startswith("prefect.")
    ]
    assert offenders == []


def test_lower_packages_never_import_the_run_layer():
    offenders = [
        (str(p.relative_to(ROOT)), name)
        for package in LOWER
        for p in _modules(f"ragen_core/{package}")
        for name in _imports(_tree(p))
        if name == "ragen_core.run" or name.startswith("ragen_core.run.")
    ]
    assert offenders == []


def test_only_storage_spells_lake_file_names():
    offenders = []
    for path in _modules("ragen_core", "flows", "tasks"):
        if path.is_relative_to(ROOT / "ragen_core" / "storage"):
            continue
        tree = _tree(path)
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                offenders += [(path.name, node.lineno, t) for t in LAKE_TOKENS if t in node.value]
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                for side in (node.left, node.right):
                    if isinstance(side, ast.Constant) and side.value in LAKE_FOLDERS:
                        offenders.append((path.name, node.lineno, side.value))
    assert offenders == []


def test_the_check_sees_a_lake_path_built_by_hand(tmp_path):
    """The two patterns above match what they are meant to (a check that cannot fail proves nothing)."""
    tree = ast.parse('p = root / "runs" / run / "checkpoints"\nq = f"iteration={n}"\n"""docstring: iteration=1"""')
    constants = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any("iteration=" in c for c in constants)
    divisions = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)]
    assert {s.value for n in divisions for s in (n.left, n.right) if isinstance(s, ast.Constant)} == {
        "runs",
        "checkpoints",
    }


def _tasks() -> list[tuple[str, ast.FunctionDef]]:
    """The Prefect tasks that wrap core functions (the artifact tasks of reporting.py call Prefect's own API)."""
    out = []
    for path in _modules("tasks"):
        if path.name == "reporting.py":
            continue
        for node in _tree(path).body:
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and getattr(d.func, "id", None) == "task" for d in node.decorator_list
            ):
                out.append((path.name, node))
    return out


@pytest.mark.parametrize("module,task", [(m, t) for m, t in _tasks()], ids=lambda x: getattr(x, "name", x))
def test_a_task_is_named_as_the_core_function_it_calls(module, task):
    (decorator,) = [d for d in task.decorator_list if isinstance(d, ast.Call)]
    name = next(k.value.value for k in decorator.keywords if k.arg == "name")
    assert name == task.name
    calls = [n.func for n in ast.walk(task) if isinstance(n, ast.Call)]
    called = {f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None) for f in calls}
    assert task.name in called, f"{module}: task {task.name!r} calls {called}"


def test_no_function_is_longer_than_sixty_lines():
    long = [
        (str(p.relative_to(ROOT)), node.name, node.end_lineno - node.lineno + 1)
        for p in _modules("ragen_core", "flows", "tasks", "schemas")
        for node in ast.walk(_tree(p))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert long == []
