"""One name per stage, said in its row of the iteration's table (:data:`ragen_core.run.stages.ITERATION`; docs/
architecture.md, "The life of one iteration"): the rows name distinct stages, in the order the docs draw them; only
the table's runner times a stage (:class:`~ragen_core.run.clock.StageClock`, checked on the source), and task runs
take their ``-i{iteration}`` names from :func:`~ragen_core.run.clock.run_name`; so the clock (``time/<stage>``), the
manifest's position, the task run (``<stage>-i<n>``) and the docs cannot drift apart."""

from __future__ import annotations

import ast
import inspect
import re

from ragen_core.run.clock import run_name
from ragen_core.run.stages import FINAL_VALIDATION, ITERATION
from tests.test_architecture import ROOT, _modules, _tree

RUNNER = "ragen_core/run/iteration.py"  # the one module that builds a stage clock


def clock_offences(tree: ast.Module) -> list[str]:
    """Calls of ``StageClock(...)``: a stage timed by hand instead of by a table's row."""
    return [
        f"line {node.lineno}: {ast.unparse(node)} times stages by hand"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "StageClock"
    ]


def task_name_offences(tree: ast.Module) -> list[str]:
    """``task_run_name=`` templates holding ``{iteration}`` spelled by hand instead of made by ``run_name(...)``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            value = keyword.value
            made = isinstance(value, ast.Call) and ast.unparse(value.func) == "run_name"
            if keyword.arg != "task_run_name" or made:
                continue
            if "{iteration}" in ast.unparse(value):
                found.append(f"line {node.lineno}: task_run_name={ast.unparse(value)} spells its stage by hand")
    return found


def test_only_the_tables_runner_times_stages():
    folders = ("ragen_core", "flows", "tasks", "ragen_cli")
    offenders = [
        (rel, o)
        for p in _modules(*folders)
        if (rel := p.relative_to(ROOT).as_posix()) != RUNNER
        for o in clock_offences(_tree(p))
    ]
    assert offenders == []
    assert clock_offences(_tree(ROOT / RUNNER)) != []  # the runner does build it (else the exemption is stale)


def test_task_runs_are_named_by_run_name():
    offenders = [(str(p.relative_to(ROOT)), o) for p in _modules("tasks") for o in task_name_offences(_tree(p))]
    assert offenders == []


def test_the_stage_checks_see_stages_spelled_by_hand():
    """Both checks catch a stage timed or named by hand (a check that cannot fail proves nothing) and pass the rest."""
    flow = ast.parse(
        "def iteration(session, i, metrics):\n"
        "    run_iteration(session, i, ITERATION, call=call_as_task)\n"
        "    stage = StageClock(session.record, i, metrics)\n"
        "    clock = run.clock.StageClock(session.record, i, metrics)\n"
    )
    assert clock_offences(flow) == [
        "line 3: StageClock(session.record, i, metrics) times stages by hand",
        "line 4: run.clock.StageClock(session.record, i, metrics) times stages by hand",
    ]
    tasks = ast.parse(
        "@task(name='generate_rollouts', task_run_name='rollout-i{iteration}')\ndef a(): ...\n"
        "@task(name='skip_iteration', task_run_name=run_name('skip'))\ndef b(): ...\n"
        "step_task = task(f, name=f.__name__, task_run_name=run_name(step.stage))\n"
        "@task(name='offline_epoch', task_run_name='epoch-i{epoch}')\ndef d(): ...\n"
    )
    assert task_name_offences(tasks) == ["line 1: task_run_name='rollout-i{iteration}' spells its stage by hand"]


def test_each_stage_is_one_row_under_one_name():
    """The rows name distinct stages, in run order; the final validation's rows are the iteration's stages."""
    stages = [step.stage for step in ITERATION]
    assert stages == ["evaluate", "generate", "persist", "validate", "filter", "diagnose", "update", "commit"]
    assert [step.stage for step in FINAL_VALIDATION] == ["evaluate", "commit"]
    assert FINAL_VALIDATION[-1] is ITERATION[-1]  # the same commit row
    assert run_name("filter").format(iteration=3) == "filter-i3"


def test_every_step_takes_session_iteration_and_state():
    """A step's task run name is formatted from its ``iteration`` parameter, and the runner passes three arguments."""
    for step in {*ITERATION, *FINAL_VALIDATION}:
        for function in (step.function, step.when):
            assert list(inspect.signature(function).parameters) == ["session", "iteration", "state"], function


def test_the_docs_draw_the_iteration_as_the_table_runs_it():
    """docs/architecture.md's "life of one iteration": its left column is the table's stages, in order (a stage
    that runs only when due in brackets)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    diagram = text.split("## The life of one iteration", 1)[1].split("```", 2)[1]
    drawn = re.findall(r"^  (\[?[a-z]+\]?) ", diagram, re.M)
    due = {step.stage for step in ITERATION if step.when.__name__ != "always"}
    assert drawn == [f"[{s.stage}]" if s.stage in due else s.stage for s in ITERATION]
