"""The layers of the project, checked on the source itself (parsed, never imported): no import runs back up.

- every package of the project (a folder of ``ragen_core``, a top-level module of it, or one of ``schemas``,
  ``tasks``, ``flows``, ``ragen_cli``) stands on one floor of :data:`FLOORS` and imports only what stands on lower
  floors (or itself): storage stores tables and never imports rollout, training never imports the run layer, ...;
- ``ragen_cli`` (the ``ragen`` command line) sits above the Prefect flows: ``flows``, ``tasks``, ``schemas`` and
  ``ragen_core`` never import it;
- ``ragen_view`` (the rollout viewer) stands above the core and below the command line, and reads: it imports none
  of :data:`VIEW_NEVER_IMPORTS` (the update's rows and advantages it shows come from ``ragen_core.update``, below
  training).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_architecture import ROOT, STATEMENT_COUNTED, _imports

BELOW_THE_CLI = ("ragen_core", "schemas", "tasks", "flows", "ragen_view")
PACKAGES = ("ragen_core", "schemas", "tasks", "flows", "ragen_view", "ragen_cli")
# lowest first; a unit imports only units of lower floors (docs/architecture.md draws them)
FLOORS: tuple[tuple[str, ...], ...] = (
    (
        "ragen_core.registry",
        "ragen_core.seeding",
        "ragen_core.faults",
        "ragen_core.native_ops",
        "ragen_core.lineage",
        "ragen_core.stops",
    ),
    ("schemas", "ragen_core.config"),
    ("ragen_core.tools",),  # tools as data: schemas of typed functions, call parsers, call records
    ("ragen_core.agent", "ragen_core.envs", "ragen_core.algos"),
    ("ragen_core.policy", "ragen_core.storage"),
    ("ragen_core.update",),
    ("ragen_core.rollout",),  # the rollout room: backends, samplers, the rollout policy, the weight hand-off
    ("ragen_core.training",),  # the updater hands new weights to the rollout side (Updater.sync)
    ("ragen_core.monitor",),
    ("ragen_core.run",),
    ("ragen_core.sweep",),
    ("ragen_core.findings",),
    ("ragen_core.api",),
    ("tasks",),
    ("flows",),
    ("ragen_view",),
    ("ragen_cli",),
)
# What the viewer never imports, and why: it shows what the lake holds, it trains and runs nothing.
VIEW_NEVER_IMPORTS = {
    "ragen_core.training": "the DeepSpeed engines: the update's rows and advantages come from ragen_core.update",
    "ragen_core.run": "the run layer takes a run's lock and writes its lake",
    "ragen_core.api": "the commands, run in-process",
    "tasks": "Prefect's tasks",
    "flows": "Prefect's flows",
}
FLOOR = {unit: floor for floor, units in enumerate(FLOORS) for unit in units}


def unit(module: str) -> str | None:
    """The unit of a dotted module name: ``ragen_core.<package or module>``, or its top-level package; None when
    it is not the project's (or is ``ragen_core`` itself, which holds nothing of its own)."""
    parts = module.split(".")
    if parts[0] == "ragen_core":
        return f"ragen_core.{parts[1]}" if len(parts) > 1 else None
    return parts[0] if parts[0] in FLOOR else None


def upward_imports(module: str, tree: ast.Module) -> list[str]:
    """The imports of ``module`` (a dotted name) that name a unit on its own floor or above, other than its own
    unit; an import of a unit missing from :data:`FLOORS` is one too (every unit has a floor)."""
    own = unit(module)
    found = []
    for name in sorted(_imports(tree)):
        other = unit(name)
        if other is None or other == own:
            continue
        if other not in FLOOR:
            found.append(f"{name} (no floor: add it to FLOORS)")
        elif FLOOR[other] >= FLOOR[own]:
            found.append(name)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_unit_has_a_floor():
    """A new package or top-level module of ragen_core gets its floor in FLOORS (the import check needs it)."""
    found = {
        unit(_module_name(p)) or _module_name(p)
        for p in sorted((ROOT / "ragen_core").glob("*"))
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert sorted(found - set(FLOOR)) == []


def test_every_package_on_a_floor_has_its_functions_counted():
    """The 50-statement rule (tests/test_architecture.py) holds in every package that stands on a floor: a package
    added to FLOORS (as the viewer was) is counted too."""
    assert sorted({unit.split(".")[0] for unit in FLOOR} - set(STATEMENT_COUNTED)) == []


def test_no_import_runs_back_up():
    """Every module imports only what stands below its own unit (or inside it)."""
    offenders = [
        (str(path.relative_to(ROOT)), name)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if unit(_module_name(path)) is not None
        for name in upward_imports(_module_name(path), ast.parse(path.read_text(), filename=str(path)))
    ]
    assert offenders == []


def test_the_floor_check_sees_an_import_running_back_up():
    """The check above catches a planted violation (a check that cannot fail proves nothing): storage importing
    rollout, training importing the run layer, a flow importing the CLI, a unit without a floor; it lets imports
    of lower floors and of the unit itself pass."""
    planted = ast.parse(
        "from ragen_core.rollout.types import TrajectoryRecord\n"
        "def f():\n    import ragen_core.run.session\n"
        "from ragen_core.storage import layout\nfrom schemas import TURNS\nimport ragen_core.faults\n"
        "from ragen_core.newthing import x\n"
    )
    assert upward_imports("ragen_core.storage.lake", planted) == [
        "ragen_core.newthing (no floor: add it to FLOORS)",
        "ragen_core.newthing.x (no floor: add it to FLOORS)",
        "ragen_core.rollout.types",
        "ragen_core.rollout.types.TrajectoryRecord",
        "ragen_core.run.session",
    ]
    assert upward_imports("ragen_core.training.group", ast.parse("from ragen_core.run import worker\n")) == [
        "ragen_core.run",
        "ragen_core.run.worker",
    ]
    assert upward_imports("flows.train", ast.parse("from ragen_cli.common import fail\n")) == [
        "ragen_cli.common",
        "ragen_cli.common.fail",
    ]


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


def view_imports(tree: ast.Module) -> list[str]:
    """The imports of one module's tree that name a unit of :data:`VIEW_NEVER_IMPORTS` (or a module inside one)."""
    return sorted(
        name for name in _imports(tree) if any(name == u or name.startswith(f"{u}.") for u in VIEW_NEVER_IMPORTS)
    )


def test_the_viewer_imports_no_training():
    """The viewer shows the update's advantage of a token through the function the update calls
    (``ragen_core.update.advantages.update_advantages``), never through the training package or a copy of its
    steps; it imports nothing that runs a run."""
    offenders = [
        (str(path.relative_to(ROOT)), name)
        for path in sorted((ROOT / "ragen_view").rglob("*.py"))
        for name in view_imports(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert offenders == []


def test_the_view_check_sees_a_planted_training_import():
    """The check above catches each import form of a planted violation (a check that cannot fail proves nothing),
    and lets the viewer's own imports pass: the update's rows and advantages, the lake, the envs."""
    planted = ast.parse(
        "def advantages():\n    from ragen_core.training.inputs import update_inputs\n"
        "import ragen_core.training\nfrom ragen_core import training\nfrom ragen_core.run.entry import open_run\n"
        "from ragen_core.update.advantages import update_advantages\nfrom ragen_core.storage import DataLake\n"
        "from ragen_core.envs import make_env\nimport ragen_core.trainingwheels\n"
    )
    assert view_imports(planted) == [
        "ragen_core.run.entry",
        "ragen_core.run.entry.open_run",
        "ragen_core.training",
        "ragen_core.training.inputs",
        "ragen_core.training.inputs.update_inputs",
    ]
    assert upward_imports("ragen_view.tokens", ast.parse("from ragen_cli.common import fail\n")) == [
        "ragen_cli.common",
        "ragen_cli.common.fail",
    ]
    assert upward_imports("ragen_core.update.inputs", ast.parse("from ragen_view import tokens\n")) == [
        "ragen_view",
        "ragen_view.tokens",
    ]
