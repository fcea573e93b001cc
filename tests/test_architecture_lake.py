"""The lake's rules (docs/architecture.md), checked on the source (parsed, never imported):

- a lake is made once per entry and handed down: ``DataLake(...)`` is built only where a process or a command enters
  (the CLI's commands, the flows, the run entry, the launched update group's worker), at most once per function, and
  elsewhere only by a public function that takes a data root or a lake (``lake = root if isinstance(root, DataLake)
  else DataLake(root)``), which a caller holding a lake passes as is;
- storage's two wings: the core lake (``ragen_core/storage``) never imports its maintenance wing
  (``ragen_core/storage/maintenance``: compaction, housekeeping, upgrade, export, space), which works on a lake from
  outside.
"""

from __future__ import annotations

import ast

from tests.test_architecture import ROOT, _imports, _modules, _tree

ENTRIES = {
    "ragen_cli": "the commands: each builds the lake of its data root once",
    "flows": "a flow run started by a deployment has only its data_root parameter",
    "ragen_core/run/entry.py": "the one entry for a run (open_run): takes a root or a lake",
    "ragen_core/training/worker.py": "a launched update group's process: its command names the data root",
    "ragen_core/storage/lake.py": "the class itself",
}
MAINTENANCE = "ragen_core.storage.maintenance"
MAINTENANCE_DIR = ROOT / "ragen_core" / "storage" / "maintenance"


def _builds(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DataLake"


def _passes_a_lake_through(node: ast.IfExp) -> bool:
    """``x if isinstance(x, DataLake) else DataLake(x)``: a lake given is used as it is."""
    test = node.test
    return (
        isinstance(test, ast.Call)
        and getattr(test.func, "id", None) == "isinstance"
        and len(test.args) == 2
        and getattr(test.args[1], "id", None) == "DataLake"
        and _builds(node.orelse)
    )


def lake_offences(tree: ast.Module, entry: bool) -> list[str]:
    """Lakes built outside an entry (but through the pass-through pattern), or more than once in one function."""
    passed = {
        id(node.orelse) for node in ast.walk(tree) if isinstance(node, ast.IfExp) and _passes_a_lake_through(node)
    }
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        nested = [n for child in function.body for n in ast.walk(child) if isinstance(n, functions)]
        inner = {id(n) for f in nested for n in ast.walk(f)}  # counted as their own function
        built = [n for child in function.body for n in ast.walk(child) if _builds(n) and id(n) not in inner]
        if not entry:
            found += [f"line {n.lineno}: {function.name} builds a lake" for n in built if id(n) not in passed]
        elif len(built) > 1:
            found.append(f"line {function.lineno}: {function.name} builds {len(built)} lakes")
    return found


def _is_entry(relative: str) -> bool:
    return any(relative == entry or relative.startswith(f"{entry}/") for entry in ENTRIES)


def test_a_lake_is_built_once_per_entry_and_handed_down():
    offenders = [
        (relative, offence)
        for path in _modules("ragen_core", "flows", "tasks", "ragen_cli")
        for relative in [str(path.relative_to(ROOT))]
        for offence in lake_offences(_tree(path), _is_entry(relative))
    ]
    assert offenders == []


def test_the_lake_check_sees_a_lake_built_on_the_way():
    """A lake rebuilt below an entry, or twice in one command, is caught (a check that cannot fail proves nothing);
    the pass-through pattern and one lake per command pass."""
    below = ast.parse(
        "def read(root):\n    return DataLake(root).read_table('metrics')\n"
        "def query(root):\n    lake = root if isinstance(root, DataLake) else DataLake(root)\n    return lake\n"
    )
    assert lake_offences(below, entry=False) == ["line 2: read builds a lake"]
    command = ast.parse(
        "def runs(root):\n    lake = DataLake(root)\n    show(lake)\n"
        "def train(root):\n    lake = DataLake(root)\n    summary(DataLake(root))\n"
    )
    assert lake_offences(command, entry=True) == ["line 4: train builds 2 lakes"]


def maintenance_imports(tree: ast.Module) -> list[str]:
    """The imports of the maintenance wing in one module's tree (every import form, at any depth)."""
    return sorted(name for name in _imports(tree) if name == MAINTENANCE or name.startswith(f"{MAINTENANCE}."))


def test_the_core_lake_never_imports_its_maintenance_wing():
    """The core lake (layout, files, the commit protocol, the read path, locks, the catalog) stands on its own: the
    maintenance wing takes a lake and works on it, never the other way round."""
    core = [p for p in _modules("ragen_core/storage") if not p.is_relative_to(MAINTENANCE_DIR)]
    assert len(core) > 10 and MAINTENANCE_DIR.is_dir()  # the folders are where the rule looks
    offenders = [(str(p.relative_to(ROOT)), name) for p in core for name in maintenance_imports(_tree(p))]
    assert offenders == []


def test_the_wing_check_sees_the_core_importing_maintenance():
    """The check above catches a planted violation in each import form (a check that cannot fail proves nothing) and
    lets the core's own imports pass."""
    planted = ast.parse(
        "from ragen_core.storage.maintenance import compact_run\n"
        "import ragen_core.storage.maintenance.export\n"
        "def f():\n    from ragen_core.storage.maintenance.space import out_of_space\n"
        "from ragen_core.storage import maintenance, layout\n"
        "from ragen_core.storage.locks import run_lock\nimport ragen_core.storage.maintenance_notes\n"
    )
    assert maintenance_imports(planted) == [
        "ragen_core.storage.maintenance",
        "ragen_core.storage.maintenance.compact_run",
        "ragen_core.storage.maintenance.export",
        "ragen_core.storage.maintenance.space",
        "ragen_core.storage.maintenance.space.out_of_space",
    ]
