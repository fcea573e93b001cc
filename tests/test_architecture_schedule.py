"""One decider of a run's schedule, checked on the source (parsed, never imported), and on a planted module too.

The rule: ``trainer.max_staleness`` is read (an attribute ``max_staleness``, or ``getattr(x, "max_staleness")``) by
``ragen_core/run/schedule.py`` alone, which turns it into the session's :class:`~ragen_core.run.schedule.Schedule`;
every other module of ``ragen_core``, ``schemas``, ``tasks``, ``flows`` and ``ragen_cli`` asks the schedule
(``session.schedule``, or ``Schedule.of(config)`` before a session exists) whatever it decides: the loop, the
hand-off, a sampler of its own, the batches a resume keeps, what a resume or an extension refuses. Values may be
carried on as numbers (the data contracts take the staleness bound as an argument, ``max_staleness=...``: a keyword,
not a read). The modules below the run layer cannot see the schedule; the few that read the value there are listed in
:data:`VALUE_READERS`, each with what it checks, and none of them runs or orders a stage. (``ragen_view`` reads stored
configs as dictionaries, a run's settings shown: it decides no run's course and is not scanned.)
"""

from __future__ import annotations

import ast

from tests.test_architecture import ROOT, _modules, _tree

SCHEDULE = "ragen_core/run/schedule.py"
SCANNED = ("ragen_core", "schemas", "tasks", "flows", "ragen_cli")
VALUE_READERS = {
    "ragen_core/config/tree.py": "load-time checks of settings that do not fit an async run (filter_entropy=full)",
    "ragen_core/training/starpo.py": "the update's `auto` choice of old log-probs: stored ones only when no batch may "
    "be stale (the bound is 0); the training layer gets the run's config as data, below the schedule",
}


def staleness_reads(tree: ast.Module) -> list[str]:
    """``line N: <code>`` of each read of ``max_staleness``: an attribute (``config.trainer.max_staleness``) or a
    ``getattr`` with that literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "max_staleness":
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value == "max_staleness":
                found.append((node.lineno, ast.unparse(node)))
    return [f"line {line}: {code}" for line, code in sorted(found)]


def test_only_the_schedule_reads_max_staleness():
    offenders = [
        (rel, hit)
        for path in _modules(*SCANNED)
        if (rel := path.relative_to(ROOT).as_posix()) != SCHEDULE and rel not in VALUE_READERS
        for hit in staleness_reads(_tree(path))
    ]
    assert offenders == []
    assert staleness_reads(_tree(ROOT / SCHEDULE)) != []  # the schedule does read it (else the rule is stale)
    for reader in VALUE_READERS:  # each listed reader still reads it (else its line goes)
        assert staleness_reads(_tree(ROOT / reader)) != [], reader


PLANTED = """
def iterations(session, first):
    if session.config.trainer.max_staleness:  # a second decider of the loop
        return overlapped(session, first)
    trainer = session.config.trainer
    k = getattr(trainer, "max_staleness")
    ahead = range(first + 1, first + 1 + trainer.max_staleness)
    validate(rows, max_staleness=session.schedule.staleness)  # a value carried on: not a read
    return session.schedule.overlapped
"""


def test_the_staleness_check_sees_a_second_decider():
    """The check catches each way of reading it in a planted module (a check that cannot fail proves nothing), and
    passes a keyword that carries the schedule's number and the schedule's own attributes."""
    assert staleness_reads(ast.parse(PLANTED)) == [
        "line 3: session.config.trainer.max_staleness",
        "line 6: getattr(trainer, 'max_staleness')",
        "line 7: trainer.max_staleness",
    ]
