"""One name per stage (docs/architecture.md, "The life of one iteration"), checked on the source (parsed, never
imported): the flows time a stage only by an :class:`~ragen_core.run.clock.IterationStage` member, and an
iteration's task runs take their names from the same members, so the clock (``time/<stage>``), the manifest's
position, the task run (``<stage>-i<n>``) and the docs cannot drift apart."""

from __future__ import annotations

import ast

from ragen_core.run.clock import IterationStage
from tests.test_architecture import ROOT, _modules, _tree


def _is_member(node: ast.AST) -> bool:
    """``IterationStage.X`` (or ``IterationStage.X.run_name``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
        if isinstance(node, ast.Name) and node.id == "IterationStage":
            return True
    return False


def clock_offences(tree: ast.Module) -> list[str]:
    """Calls of a stage clock (a name bound to ``StageClock(...)``) whose stage is not an ``IterationStage``
    member."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        clocks = {
            target.id
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "StageClock"
            for target in node.targets
            if isinstance(target, ast.Name)
        }  # fmt: skip
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in clocks:
                if not node.args or not _is_member(node.args[0]):
                    found.append(f"line {node.lineno}: {ast.unparse(node)} names its stage by hand")
    return found


def task_name_offences(tree: ast.Module) -> list[str]:
    """``task_run_name=`` templates of an iteration's tasks (they hold ``{iteration}``) spelled by hand instead of
    taken from an ``IterationStage`` member."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg != "task_run_name" or _is_member(keyword.value):
                continue
            value = keyword.value
            if isinstance(value, ast.Call) and any(_is_member(a) for a in value.args):
                continue  # batch_run_name(IterationStage.PERSIST)
            if "{iteration}" in ast.unparse(value):
                found.append(f"line {node.lineno}: task_run_name={ast.unparse(value)} spells its stage by hand")
    return found


def test_the_flows_time_stages_by_their_one_name():
    offenders = [(str(p.relative_to(ROOT)), o) for p in _modules("flows") for o in clock_offences(_tree(p))]
    assert offenders == []


def test_iteration_task_runs_are_named_by_their_stage():
    offenders = [(str(p.relative_to(ROOT)), o) for p in _modules("tasks") for o in task_name_offences(_tree(p))]
    assert offenders == []


def test_the_stage_checks_see_names_spelled_by_hand():
    """Both checks catch a stage spelled by hand (a check that cannot fail proves nothing) and pass the members."""
    flow = ast.parse(
        "def iteration(session, i, metrics):\n"
        "    stage = StageClock(session.record, i, metrics)\n"
        "    with stage(IterationStage.GENERATE):\n        pass\n"
        "    with stage('filter'):\n        pass\n"
    )
    assert clock_offences(flow) == ["line 5: stage('filter') names its stage by hand"]
    tasks = ast.parse(
        "@task(name='generate_rollouts', task_run_name='rollout-i{iteration}')\ndef a(): ...\n"
        "@task(name='persist', task_run_name=batch_run_name(IterationStage.PERSIST))\ndef b(): ...\n"
        "@task(name='update_policy', task_run_name=IterationStage.UPDATE.run_name)\ndef c(): ...\n"
        "@task(name='offline_epoch', task_run_name='epoch-i{epoch}')\ndef d(): ...\n"
    )
    assert task_name_offences(tasks) == ["line 1: task_run_name='rollout-i{iteration}' spells its stage by hand"]


def test_a_stage_runs_under_its_one_name():
    """The member's value is the name everything shows: the clock key, the task run, the manifest position."""
    assert IterationStage.FILTER.run_name.format(iteration=3) == "filter-i3"
    assert f"time/{IterationStage.GENERATE}" == "time/generate"
    assert [s.value for s in IterationStage][:8] == [
        "evaluate", "generate", "persist", "validate", "filter", "diagnose", "update", "commit",
    ]  # fmt: skip
