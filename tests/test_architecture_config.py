"""The config is plain data, checked on the source itself (parsed, never imported).

- no module of ``ragen_core/config`` imports the packages that hold the registries or use the config (algos, envs,
  rollout, policy, training, storage, run), at its top or inside a function;
- no pydantic validator of the config imports anything or calls what the module took from another package of the
  project: the names a config gives of registered things are checked by the loader (``ragen_core.run.checks``)
  after pydantic has validated the tree;
- outside the config package and that loader, no code builds a config without the checks (``build_config``,
  ``load_config``, ``RunConfig.model_validate``), but for the few places listed with their reason;
- a config read back from the data root (``stored_config``) is built into a run's config only by the loader's
  ``build_stored_run_config`` (which refuses the programs and outside folders it names): elsewhere it is only read
  (the places listed with their reason).
"""

from __future__ import annotations

import ast

from tests.test_architecture import ROOT, _tree

CONFIG = ROOT / "ragen_core" / "config"
ABOVE_THE_CONFIG = ("algos", "envs", "rollout", "policy", "training", "storage", "run")
VALIDATORS = {"field_validator", "model_validator"}


def config_imports_above(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, module)`` of every import (anywhere in the module) of a package the config may not import."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ragen_core" and len(parts) > 1 and parts[1] in ABOVE_THE_CONFIG:
                found.append((node.lineno, name))
                break
    return sorted(found)


def _foreign_names(tree: ast.Module) -> set[str]:
    """Names the module binds to something of the project outside the config package (``ragen_core.registry``
    included)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ragen_core"):
            if not (node.module or "").startswith("ragen_core.config"):
                names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("ragen_core")
            }
    return names


def _is_validator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name in VALIDATORS:
            return True
    return False


def _reaches_out(function: ast.AST, foreign: set[str]) -> list[str]:
    """An import inside ``function``, or a use of a name the module took from another package of the project."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(f"imports at line {node.lineno}")
        elif isinstance(node, ast.Name) and node.id in foreign:
            found.append(f"uses {node.id} at line {node.lineno}")
    return found


def validators_reaching_out(tree: ast.Module) -> list[str]:
    """What a pydantic validator of the module does that a plain-data check does not: an import inside it, a use
    of a name the module took from another package of the project (a registry, a make_env, ...), or a call of a
    function of the module that does either (at any depth)."""
    foreign = _foreign_names(tree)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    reaching = {name for name, function in functions.items() if _reaches_out(function, foreign)}
    while True:  # a function calling one that reaches out reaches out too
        calls = {
            name: {getattr(c.func, "id", None) for c in ast.walk(f) if isinstance(c, ast.Call)}
            for name, f in functions.items()
        }
        more = {name for name, called in calls.items() if called & reaching} - reaching
        if not more:
            break
        reaching |= more
    found = []
    for name, function in functions.items():
        if _is_validator(function):
            found += [f"{name} {what}" for what in _reaches_out(function, foreign)]
            found += [f"{name} calls {callee}" for callee in sorted(calls[name] & reaching - {name})]
    return found


def test_no_config_module_imports_the_packages_above_it():
    offenders = [
        (str(path.relative_to(ROOT)), line, name)
        for path in sorted(CONFIG.rglob("*.py"))
        for line, name in config_imports_above(_tree(path))
    ]
    assert offenders == []


def test_no_config_validator_calls_a_registry():
    offenders = [
        (str(path.relative_to(ROOT)), offence)
        for path in sorted(CONFIG.rglob("*.py"))
        for offence in validators_reaching_out(_tree(path))
    ]
    assert offenders == []


PLANTED = """
from pydantic import model_validator
from ragen_core.algos import ADVANTAGES
from ragen_core.config.base import Section
from ragen_core.registry import keyword_parameters
import ragen_core.storage.layout

class Algorithm(Section):
    @model_validator(mode="after")
    def _check(self):
        from ragen_core.envs import registered_envs
        if self.adv_estimator not in ADVANTAGES:
            raise ValueError("unknown")
        return self

    @property
    def needs_critic(self):
        return "values" in keyword_parameters(ADVANTAGES.get(self.adv_estimator))

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data):
        return Section.model_fields and data

class Run(Section):
    @model_validator(mode="after")
    def _check_cross_fields(self):
        _check_names(self)
        return self

def _check_names(config):
    _check_envs(config)

def _check_envs(config):
    from ragen_core.envs import make_env
    make_env(config.env.name)
"""


def test_the_config_checks_see_a_registry_reached_for():
    """Each rule catches a planted violation (a check that cannot fail proves nothing): imports of algos, envs and
    storage (at the top and inside functions), a validator's lazy import and its use of an imported registry, a
    validator calling a function that calls one that imports; a property outside any validator and a validator using
    only the config's own names pass the second rule."""
    tree = ast.parse(PLANTED)
    assert config_imports_above(tree) == [
        (3, "ragen_core.algos"),
        (6, "ragen_core.storage.layout"),
        (11, "ragen_core.envs"),
        (35, "ragen_core.envs"),
    ]
    assert validators_reaching_out(tree) == [
        "_check imports at line 11",
        "_check uses ADVANTAGES at line 12",
        "_check_cross_fields calls _check_names",
    ]


LOADER = ROOT / "ragen_core" / "run" / "checks.py"
UNCHECKED_BUILDERS = ("build_config", "load_config", "model_validate")
BUILDS_UNCHECKED = {
    "ragen_core/training/worker.py": "a launched update group's process: its config is the run's, checked by the "
    "process that launched it",
}


def unchecked_builds(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of every call of a config builder that skips the registry checks."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            owner = getattr(node.func, "value", None)
            if name == "model_validate" and getattr(owner, "id", None) != "RunConfig":
                continue  # another model's validation
            if name in UNCHECKED_BUILDERS:
                found.append((node.lineno, name))
    return sorted(found)


def test_every_config_for_a_run_is_built_through_the_checks():
    offenders = [
        (str(path.relative_to(ROOT)), line, name)
        for package in ("ragen_core", "flows", "tasks", "ragen_cli")
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.is_relative_to(CONFIG) and path != LOADER and str(path.relative_to(ROOT)) not in BUILDS_UNCHECKED
        for line, name in unchecked_builds(_tree(path))
    ]
    assert offenders == []


def test_the_loader_check_sees_a_config_built_without_the_checks():
    """The check above catches a planted violation of each builder, and lets the checked ones (and another model's
    validation) pass."""
    planted = ast.parse(
        "from ragen_core import config\n"
        "a = config.build_config(tree)\nb = load_config(path)\nc = RunConfig.model_validate(tree)\n"
        "d = build_run_config(tree)\ne = load_run_config(path)\nf = Manifest.model_validate(tree)\n"
    )
    assert unchecked_builds(planted) == [(2, "build_config"), (3, "load_config"), (4, "model_validate")]
    assert unchecked_builds(_tree(LOADER)) != []  # the loader builds them itself: the one module allowed to


STORED_READERS = {
    "ragen_core/run/decisions.py": "compares a run's stored config with the new one, key by key (builds nothing)",
    "ragen_core/findings/analysis.py": "reads the monitor settings a run was stored with (builds nothing)",
    "ragen_core/findings/studies.py": "reads the monitor settings a run was stored with (builds nothing)",
    "ragen_core/run/chat.py": "writes out the chat a run's prompt settings give (ragen export's README), through "
    "build_stored_run_config: a stored env or reward of the user's own code is refused, never imported",
}


def stored_config_calls(tree: ast.Module) -> list[int]:
    """Lines of every call of ``stored_config`` (a config tree read back from the data root, filled in)."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = [(n.lineno, getattr(n.func, "attr", None) or getattr(n.func, "id", None)) for n in calls]
    return sorted(line for line, name in names if name == "stored_config")


def test_a_stored_config_is_built_only_through_the_trust_check():
    offenders = [
        (str(path.relative_to(ROOT)), line)
        for package in ("ragen_core", "flows", "tasks", "ragen_cli")
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.is_relative_to(CONFIG) and path != LOADER and str(path.relative_to(ROOT)) not in STORED_READERS
        for line in stored_config_calls(_tree(path))
    ]
    assert offenders == []
    planted = ast.parse("from ragen_core import config\nc = build_run_config(config.stored_config(tree))\n")
    assert stored_config_calls(planted) == [2]
    assert stored_config_calls(_tree(LOADER)) != []  # the loader fills a stored tree in itself
