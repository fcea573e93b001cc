"""The ``train`` flow reads as its stages (issue 67, item 4): flows/train.py spells the run's course (open the session,
[restore], the schedule's iterations, the final validation, close) as calls of the run layer's stage functions, and
that course is :func:`ragen_core.run.procedures.train`'s, the Python API's, line for line, the flow's
Prefect hooks in the place of the API's (so a run trained by either is the same run: tests/test_api.py); and
docs/architecture.md shows those lines. Checked on the source, with planted drifts."""

from __future__ import annotations

import ast
import copy
import textwrap

from tests.test_architecture import ROOT, _tree

FLOW = ROOT / "flows" / "train.py"
DOCS = ROOT / "docs" / "architecture.md"
PROCEDURES = ROOT / "ragen_core" / "run" / "procedures.py"
STAGES = ("open_training", "run_status", "restore_training", "training_iterations", "validate_final_policy")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)


def _lines(function: ast.FunctionDef, hooks: str) -> list[str]:
    """The body of ``function`` as normalised source lines, without its docstring, its hooks argument spelled
    ``hooks``."""

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.Name("hooks", node.ctx) if node.id == hooks else node

    body = function.body[1:] if ast.get_docstring(function) else function.body
    renamed = [Rename().visit(copy.deepcopy(statement)) for statement in body]  # the parsed tree is shared
    return [line for statement in renamed for line in ast.unparse(statement).splitlines()]


def course_drift(flow: ast.FunctionDef, procedure: ast.FunctionDef) -> list[str]:
    """Where the flow's stages (hooks ``PREFECT``) and the procedure's (hooks ``hooks``) differ, line by line, or []
    when they are one course."""
    ours, theirs = _lines(flow, "PREFECT"), _lines(procedure, "hooks")
    pairs = [f"{a.strip()!r} != {b.strip()!r}" for a, b in zip(ours, theirs, strict=False) if a != b]
    if len(ours) != len(theirs):
        pairs.append(f"{len(ours)} lines against {len(theirs)}")
    return pairs


def stages_called(function: ast.FunctionDef) -> list[str]:
    """The names of the plain functions ``function`` calls, in the order they appear."""
    calls = [node for node in ast.walk(function) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    return [call.func.id for call in sorted(calls, key=lambda call: (call.lineno, call.col_offset))]


def test_the_train_flow_runs_the_procedures_stages_statement_for_statement():
    flow, procedure = _function(_tree(FLOW), "_stages"), _function(_tree(PROCEDURES), "train")
    assert course_drift(flow, procedure) == []
    assert stages_called(flow) == list(STAGES)


def test_the_architecture_page_shows_the_flows_stages():
    """The page's snippet under "Requests, procedures and doors" is the flow's body, line for line."""
    text = DOCS.read_text().split("## Requests, procedures and doors", 1)[1]
    snippet = text.split("```python", 1)[1].split("```", 1)[0]
    shown = ast.parse(textwrap.dedent(snippet))
    flow = _lines(_function(_tree(FLOW), "_stages"), "PREFECT")
    assert [line for statement in shown.body for line in ast.unparse(statement).splitlines()] == [
        line.replace("hooks", "PREFECT") for line in flow
    ]


def test_both_doors_of_the_train_flow_run_the_stages():
    tree = _tree(FLOW)
    for door in ("train", "train_admitted"):
        assert "_stages" in stages_called(_function(tree, door)), door


def test_the_course_check_sees_a_flow_that_drifts_from_the_procedure():
    """A stage skipped, a stage dropped, a step added: each is a drift (a check that cannot fail proves nothing)."""
    procedure = _function(_tree(PROCEDURES), "train")
    source = ast.unparse(_function(_tree(FLOW), "_stages"))

    def drift(old: str, new: str) -> list[str]:
        assert old in source
        return course_drift(ast.parse(source.replace(old, new)).body[0], procedure)

    assert drift("", "") == []
    assert drift("first = restore_training(run, PREFECT)", "first = 0") == [
        "'first = 0' != 'first = restore_training(run, hooks)'"
    ]
    dropped = drift("\n        validate_final_policy(run.session, final, PREFECT)", "")
    assert dropped[0].endswith("!= 'validate_final_policy(run.session, final, hooks)'")
    assert dropped[1:] == ["7 lines against 8"]
    assert drift("    return {", "    PREFECT.step('done')\n    return {")[-1] == "9 lines against 8"
