"""A run's logs in Prefect's UI are not buried under Prefect's line for each task run (issue 40, section 4 item 7):
inside :func:`flows.ui.showing` the "Finished in state Completed()" lines of task runs are dropped, a failed task
run's line is kept, and Prefect's own setting of the task-run log level switches the filter off."""

from __future__ import annotations

import logging

import pytest
from prefect import flow, task

from flows import ui


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


@task
def _works() -> int:
    return 1


@task(retries=0)
def _fails() -> int:
    raise RuntimeError("no")


@flow
def _stages(shown: bool) -> None:
    def body() -> None:
        _works()
        _works()
        try:
            _fails()
        except RuntimeError:
            pass

    if shown:
        with ui.showing("quiet", []):
            body()
    else:
        body()


@pytest.fixture()
def kept(prefect_harness):
    # setLevel, not an assignment to .level: only setLevel clears the logger's cached answers to isEnabledFor, which
    # an earlier test in this worker may have left at "INFO is off" (the command line's quiet mode, say)
    handler, logger = _Kept(), logging.getLogger(ui.TASK_RUN_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def _finished(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(level, text.split("(")[0]) for level, text in lines if text.startswith("Finished in state")]


def test_completed_task_runs_are_not_logged_inside_a_run_and_failures_are(kept, monkeypatch):
    monkeypatch.delenv(ui.TASK_RUN_LEVEL_SETTING, raising=False)
    _stages(False)  # the premise: outside a run's block Prefect logs every task run's end
    assert _finished(kept) == [
        (20, "Finished in state Completed"),
        (20, "Finished in state Completed"),
        (40, "Finished in state Failed"),
    ]
    kept.clear()
    _stages(True)
    assert _finished(kept) == [(40, "Finished in state Failed")]
    assert ui._QUIET_TASK_RUNS not in logging.getLogger(ui.TASK_RUN_LOGGER).filters  # removed when the block ends


def test_prefects_own_task_run_level_setting_keeps_every_line(kept, monkeypatch):
    monkeypatch.setenv(ui.TASK_RUN_LEVEL_SETTING, "INFO")
    _stages(True)
    assert [level for level, _ in _finished(kept)] == [20, 20, 40]
