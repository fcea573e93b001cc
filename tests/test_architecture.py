"""The package shape docs/architecture.md draws, checked on the source itself (parsed, never imported).

- the core never imports Prefect;
- the lower packages never import the run layer (``ragen_core.run``);
- outside ``ragen_core/storage`` no code spells a lake file name, marker or top-level folder;
- outside ``ragen_core/storage/layout.py`` no code joins a lake name (a literal or a layout constant) onto a path;
- tasks are thin: each task's name is the name of the core function it calls;
- no function holds more than 50 statements in ragen_core/, flows/, ragen_cli/, ragen_view/, tasks/ and schemas/
  (statements, not lines: the formatter lays lines out, the count stays).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOWER = ("agent", "algos", "envs", "policy", "rollout", "storage", "training", "update")
LAKE_TOKENS = (
    "_DONE",
    "_commits",
    "_staging",
    "_locks",
    "_COMPACTION",
    "iteration=",
    "run_id=",
    "part-",
    "manifest.json",
    "checkpoint.json",
    "iteration-",
    ".compaction.json",
    "_layout.json",
)
LAKE_FOLDERS = {
    "runs",
    "checkpoints",
    "models",
    "quarantine",
    "update_group",
    "_staging",
    "_commits",
    "_locks",
    "sweeps",
    "_prefect",
}
MAX_STATEMENTS = 50  # per function: the longest held 47 when the rule moved from 60 lines to statements
STATEMENT_COUNTED = ("ragen_core", "flows", "ragen_cli", "ragen_view", "tasks", "schemas")  # the folders it holds in
LAYOUT = ROOT / "ragen_core" / "storage" / "layout.py"


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per test session (the checks only read it)."""
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


def _layout_names() -> dict[str, str]:
    """The layout's named constants that spell a name under the data root: ``{constant: name}``."""
    names = {}
    for node in _tree(LAYOUT).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            names.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
    return names


def _aliases(constants: set[str]) -> set[str]:
    """The layout's constant names and the module-level aliases other modules give them (``INFO_FILE =
    CHECKPOINT_INFO``): a module that imports one of these names from anywhere in the project holds a lake name."""
    names = set(constants)
    for path in _modules("ragen_core", "flows", "ragen_cli", "tasks"):
        for node in _tree(path).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in constants:
                names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def _bound_to_layout(tree: ast.Module, constants: set[str]) -> tuple[set[str], set[str]]:
    """The names a module binds to the layout's constants (imported from the layout or from a module that hands
    one on, renamed or not, or assigned from one) and to the layout module itself."""
    names, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ragen_core"):
            names |= {alias.asname or alias.name for alias in node.names if alias.name in constants}
            if node.module == "ragen_core.storage":
                modules |= {alias.asname or alias.name for alias in node.names if alias.name == "layout"}
    for node in tree.body:  # a constant of the layout's name spelled again, or aliased: INFO_FILE = CHECKPOINT_INFO
        if isinstance(node, ast.Assign):
            targets = {target.id for target in node.targets if isinstance(target, ast.Name)}
            aliased = isinstance(node.value, ast.Name) and node.value.id in names
            names |= targets if aliased else targets & constants
    return names, modules


def lake_tokens_spelled(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, token)`` of every string (not a docstring) that spells a lake file name, marker or folder token."""
    docstrings, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [(node.lineno, token) for token in LAKE_TOKENS if token in node.value]
    return sorted(found)


def lake_paths_joined(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, what)`` of every ``/`` that joins a lake name onto a path: a string literal naming a lake folder or
    file (or an f-string holding a lake token or a layout constant), or a named constant of the layout."""
    spelled = _layout_names()
    literals = LAKE_FOLDERS | set(spelled.values())
    names, modules = _bound_to_layout(tree, _aliases(set(spelled)))

    def named(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and node.id in names:
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            return f"{node.value.id}.{node.attr}" if node.attr in spelled else None
        return None

    def joined(side: ast.AST) -> str | None:
        if isinstance(side, ast.Constant) and side.value in literals:
            return repr(side.value)
        if isinstance(side, ast.JoinedStr):
            for part in side.values:
                if isinstance(part, ast.Constant) and any(token in part.value for token in LAKE_TOKENS):
                    return repr(part.value)
                if isinstance(part, ast.FormattedValue) and named(part.value):
                    return named(part.value)
        return named(side)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [(node.lineno, what) for what in map(joined, (node.left, node.right)) if what]
    return sorted(found)


def test_only_storage_spells_lake_file_names():
    offenders = [
        (path.name, line, token)
        for path in _modules("ragen_core", "flows", "ragen_cli", "ragen_view", "tasks")
        if not path.is_relative_to(ROOT / "ragen_core" / "storage")
        for line, token in lake_tokens_spelled(_tree(path))
    ]
    assert offenders == []


def test_only_the_layout_joins_lake_names_onto_paths():
    """Every folder and file name under the data root comes from ``ragen_core.storage.layout``: no other module,
    storage's own included, builds a lake path with ``/`` from a literal name or from one of the layout's names."""
    offenders = [
        (str(path.relative_to(ROOT)), line, what)
        for path in _modules("ragen_core", "flows", "ragen_cli", "ragen_view", "tasks", "schemas")
        if path != LAYOUT
        for line, what in lake_paths_joined(_tree(path))
    ]
    assert offenders == []


PLANTED = '''
from ragen_core.storage import layout
from ragen_core.storage.layout import CHECKPOINT_INFO, RUNS as FOLDER, run_dir
from ragen_core.storage.parts import COMPACTION_MARKER
INFO = CHECKPOINT_INFO
a = root / "runs" / run / "checkpoints"
b = root / f"iteration={n}.json"
c = root / FOLDER
d = checkpoint / INFO
e = root / layout.STAGING
f = root / f"{layout.LOCKS}-x"
g = run_dir(root, run) / name
h = "{}/_staging".format(root)
i = folder / COMPACTION_MARKER
def j():
    """docstring: _staging/iteration=1"""
'''


def test_the_checks_see_lake_paths_built_by_hand():
    """Each rule catches a planted violation (a check that cannot fail proves nothing) and lets the layout's own
    functions and docstrings pass."""
    tree = ast.parse(PLANTED)
    assert lake_paths_joined(tree) == [
        (6, "'checkpoints'"),
        (6, "'runs'"),
        (7, "'iteration='"),
        (8, "FOLDER"),
        (9, "INFO"),
        (10, "layout.STAGING"),
        (11, "layout.LOCKS"),
        (14, "COMPACTION_MARKER"),
    ]
    assert lake_tokens_spelled(tree) == [(7, "iteration="), (13, "_staging")]
    assert lake_paths_joined(_tree(LAYOUT)) != []  # the layout joins them itself: the one module allowed to


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


def _statements(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The statements a function holds, nested ones included, its docstring not: a size the formatter cannot move
    (a call laid over ten lines is one statement)."""
    docstrings = _docstrings(ast.Module(body=[function], type_ignores=[]))
    return sum(
        1
        for node in ast.walk(function)
        if isinstance(node, ast.stmt)
        and node is not function
        and not (isinstance(node, ast.Expr) and id(node.value) in docstrings)
    )


def test_no_function_holds_more_than_fifty_statements():
    long = [
        (str(p.relative_to(ROOT)), node.name, _statements(node))
        for p in _modules(*STATEMENT_COUNTED)
        for node in ast.walk(_tree(p))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _statements(node) > MAX_STATEMENTS
    ]
    assert long == []


SKIP_MARK = "# fmt" + ": skip"  # spelled in two parts, so this file does not count itself
MAX_SKIPS = 40  # ruff formats the tree; a skip is kept only for a table that reads better aligned


def test_the_formatter_is_applied_not_switched_off():
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.py"], capture_output=True, text=True, check=True)
    skips = [
        f"{name}:{number}"
        for name in tracked.stdout.split()
        if (ROOT / name).is_file()
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if SKIP_MARK in line
    ]
    assert len(skips) <= MAX_SKIPS, skips


def test_the_statement_count_is_the_layout_s_invariant():
    packed = textwrap.dedent(
        """\
        def f(a):
            "Doc."
            x = g(a, 1)
            if x:
                return x
            return None
        """
    )
    spread = textwrap.dedent(
        """\
        def f(a):
            "Doc."
            x = g(
                a,
                1,
            )
            if x:
                return x

            return None
        """
    )
    (one,), (two,) = ast.parse(packed).body, ast.parse(spread).body
    assert _statements(one) == _statements(two) == 4  # the assignment, the if, its return, the last return


NOT_REGISTRIES = {
    "ragen_core/registry.py": "the one registry class itself",
    "ragen_core/rollout/vllm_server.py": "runs under the vLLM environment's Python and imports only the standard "
    "library: its table of HTTP routes stays a dict",
}


def _registry_offences(tree: ast.Module) -> list[str]:
    """What looks like a registry of its own in one module: a class other than ``Registry`` with a ``register``
    method, a subclass of ``Registry`` (a question the registry lacks is a function over it), a module-level dict
    holding the module's functions or classes, or a function that stores into a module-level dict by subscript (the
    decorator pattern)."""
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name != "Registry":
            bases = {ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases}
            methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if "Registry" in bases:
                found.append(f"class {node.name} subclasses Registry")
            elif "register" in methods:
                found.append(f"class {node.name} registers things by itself")
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict) and any(isinstance(v, ast.Name) and v.id in defined for v in value.values):
            found.append(f"line {node.lineno}: a dict of the module's functions or classes")
    assigned = [
        n.targets if isinstance(n, ast.Assign) else [n.target]
        for n in tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
    ]
    tables = {t.id for targets in assigned for t in targets if isinstance(t, ast.Name)}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        # the decorator's inner function: stores its argument into a module-level table and returns it (a cache or a
        # state dict stores what it computed, and passes)
        returned = {n.value.id for n in function.body if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)}
        taken = {a.arg for a in function.args.args} & returned
        for node in function.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in taken:
                for target in node.targets:
                    if isinstance(target, ast.Subscript) and getattr(target.value, "id", None) in tables:
                        found.append(f"{function.name} stores into the module's table {target.value.id}")
    return found


def test_every_registry_is_the_one_registry_class():
    """Names -> things live in :class:`ragen_core.registry.Registry` (duplicates refused, unknown names listed),
    never in a registry of a module's own."""
    offenders = [
        (str(p.relative_to(ROOT)), offence)
        for p in _modules("ragen_core", "schemas", "flows", "ragen_cli", "tasks")
        if str(p.relative_to(ROOT)) not in NOT_REGISTRIES
        for offence in _registry_offences(_tree(p))
    ]
    assert offenders == []


def test_the_registry_check_sees_a_registry_of_its_own():
    """The check above catches the three shapes a hand-made registry takes (a check that cannot fail proves
    nothing) and a subclass of Registry, and lets a Registry pass."""
    planted = ast.parse(
        "class WidgetRegistry:\n    def register(self, name): ...\n"
        "class Upgrades(Registry[int]):\n    def register(self, name): ...\n"
        "def handle(x): ...\nHANDLERS = {'a': handle}\n"
        "_TABLE: dict = {}\ndef register(name):\n    def add(fn):\n        _TABLE[name] = fn\n        return fn\n"
        "    return add\n"
        "TITLES = {'a': 'A'}\n"
        "ESTIMATORS = Registry('estimator')\n"
    )
    assert _registry_offences(planted) == [
        "class WidgetRegistry registers things by itself",
        "class Upgrades subclasses Registry",
        "line 6: a dict of the module's functions or classes",
        "add stores into the module's table _TABLE",
    ]


def test_the_registry_module_is_a_leaf():
    """``ragen_core/registry.py`` imports nothing of the project, so every layer may import it; it is the one name of
    ragen_core that ``schemas`` (the lowest layer) imports."""
    ours = ("ragen_core", "schemas", "flows", "ragen_cli", "tasks")
    leaf = _imports(_tree(ROOT / "ragen_core" / "registry.py"))
    assert [name for name in leaf if name.split(".")[0] in ours] == []
    from_schemas = {name for p in _modules("schemas") for name in _imports(_tree(p)) if name.startswith("ragen_core")}
    assert from_schemas <= {"ragen_core.registry", "ragen_core.registry.Registry"}
