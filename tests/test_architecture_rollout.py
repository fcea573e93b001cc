"""The rollout room, checked on the source (parsed, never imported), and on a planted module too.

The rollout side is one package, ``ragen_core/rollout`` (tests/test_architecture_layers.py gives it a floor of its
own, under training: the updater hands it new weights): the backends (Hugging Face generate, the sampler process,
the vLLM server, scripted policies), the policy a session's rollouts use, the backends by name and the weight
hand-off. The run layer reaches it through its interface alone (:data:`ROLLOUT_INTERFACE`: the engine, the
:class:`~ragen_core.rollout.Sampler` protocol, the rollout policy, the registry of backends, the rows, scripted
policies), never through a backend's module, so a new backend (one module and one registration) changes nothing in
``ragen_core/run``.
"""

from __future__ import annotations

import ast

from tests.test_architecture import ROOT, _imports, _modules, _tree

ROLLOUT_INTERFACE = {
    "ragen_core.rollout": "the package: the engine, the Sampler protocol, scripted policies, the records' types",
    "ragen_core.rollout.engine": "the rollout engine (the chat a trained policy is sent opens as a rollout does)",
    "ragen_core.rollout.policy": "the rollout policy a session opens",
    "ragen_core.rollout.samplers": "the backends by name (the config's check) and what a backend opens with",
    "ragen_core.rollout.sampling": "the Sampler protocol",
    "ragen_core.rollout.records": "the rollouts' rows",
    "ragen_core.rollout.scripted": "scripted policies: the bootstrap's demonstrations, the config's names",
    "ragen_core.rollout.types": "the records' types",
}


def room_module(name: str) -> str:
    """The module of the rollout room a dotted import name lies in (``ragen_core.rollout.policy.RolloutPolicy`` ->
    ``ragen_core.rollout.policy``; a name the package itself gives, ``ragen_core.rollout.run_rollouts``, is the
    package's)."""
    parts = name.split(".")
    if len(parts) > 2 and (ROOT / "ragen_core" / "rollout" / f"{parts[2]}.py").is_file():
        return ".".join(parts[:3])
    return "ragen_core.rollout"


def backend_imports(tree: ast.Module) -> list[str]:
    """The modules of the rollout room a module imports beyond the room's interface."""
    room = (name for name in _imports(tree) if name == "ragen_core.rollout" or name.startswith("ragen_core.rollout."))
    return sorted({room_module(name) for name in room} - set(ROLLOUT_INTERFACE))


def test_the_run_layer_reaches_the_rollout_room_through_its_interface():
    offenders = {}
    for path in _modules("ragen_core/run"):
        rel = path.relative_to(ROOT).as_posix()
        found = backend_imports(_tree(path))
        if found:
            offenders[rel] = found
    assert offenders == {}


def test_the_rollout_check_sees_a_backend_named_by_the_run_layer():
    """The check catches a backend's module imported in each form in a planted module (a check that cannot fail
    proves nothing), and passes the interface."""
    planted = ast.parse(
        "from ragen_core.rollout.hf_backend import HFBackend\n"
        "def f():\n    import ragen_core.rollout.vllm_backend\n"
        "from ragen_core.rollout import run_rollouts, Sampler\n"
        "from ragen_core.rollout.policy import RolloutPolicy\n"
        "from ragen_core.rollout.sampler import SamplerProcess\n"
    )
    assert backend_imports(planted) == [
        "ragen_core.rollout.hf_backend",
        "ragen_core.rollout.sampler",
        "ragen_core.rollout.vllm_backend",
    ]


def sampler_classes(tree: ast.Module) -> list[str]:
    """The classes of a module that sample a turn (a ``generate`` method) or take weights (``load``): samplers."""
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and {"generate", "load"} & {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
    ]


def test_nothing_of_the_rollout_room_is_left_in_the_run_layer():
    """The run layer holds no sampler: no class of ``ragen_core/run`` samples a turn or takes weights."""
    run = _modules("ragen_core/run")
    found = [(path.relative_to(ROOT).as_posix(), name) for path in run for name in sampler_classes(_tree(path))]
    assert found == []


def test_the_sampler_check_sees_a_sampler_in_the_run_layer():
    planted = ast.parse(
        "class ProcessBackend:\n    def generate(self, contexts, seed): ...\n"
        "class Weights:\n    def load(self, module): ...\n"
        "class Record:\n    def update(self): ...\n"
    )
    assert sampler_classes(planted) == ["ProcessBackend", "Weights"]
