"""What a run shows in Prefect's UI: its flow run's name and tags, its log lines and its address.

- **Names**: a flow run is named after its run id (a sweep after its sweep id, a sweep point after its point's run
  id): at creation when the id is a parameter (``flow_run_name=named_after("run_id")``), else by :func:`showing`
  once the flow has derived it. Task runs carry their stage and iteration (``generate-i3``: tasks/iteration.py).
- **Parameters**: a flow run's parameters (a config path, overrides, a data root: free-form text) are stored on the
  server with every control character written as an escape, as log lines are: our flows are :class:`ShownFlow`
  objects (``@ui.flow``), which store them escaped when they are called, and a run created elsewhere (a deployment
  run from the UI or the API) has its stored parameters escaped by :func:`escape_stored_parameters` as its flow
  starts. The flow itself gets them as given, and refuses a text holding a control character (the config's rule).
- **Tags**: ``env:<env>``, ``preset:<preset>`` and, for a sweep and its points, ``sweep:<sweep id>``, set by
  :func:`showing` on every flow run, whoever started it (the command line, a deployment, Python).
- **Logs**: while a flow runs, the records of our own loggers (``ragen.*``: the collapse early warnings,
  ``ragen_core.*``, ``flows.*``) also go to the flow run's logs on the server; where they went before (the terminal)
  is unchanged. Each iteration's summary line goes to the server only (logger ``ragen.run``): the command line
  prints it itself, under its progress bar. Prefect's "Finished in state Completed()" line of each task run is
  dropped (:class:`_QuietTaskRuns`; failures stay), unless ``PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL`` is set.
- **Address**: :func:`showing` hands the flow run's UI address to the caller's ``started`` callback (the command
  line prints it when the user configured a server).

What the caller wants to hear of a run (progress per iteration, the address) is passed in a context
(:func:`watching`), never as a flow parameter: a deployment's parameter schema shows only what a user can set.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from prefect import Flow
from prefect.logging.handlers import APILogHandler

from ragen_core.monitor.reports import escape_controls, iteration_line

ProgressCallback = Callable[[int, dict[str, float]], None]
RUN_LOGGER = "ragen.run"  # the summary lines: the server only
FORWARDED = ("ragen", "ragen_core", "flows")  # our loggers whose records also reach the server


@dataclass(frozen=True)
class Watcher:
    """What the caller of a flow wants to hear: ``progress(iteration, metrics)`` after each committed iteration,
    ``started(url)`` with the UI address of the (outermost) flow run once it is named, and ``step(text)`` with a
    line about a long step that is not an iteration (the bootstrap's demonstrations and epochs, a sweep's points)."""

    progress: ProgressCallback | None = None
    started: Callable[[str], None] | None = None
    step: Callable[[str], None] | None = None


_WATCHER: ContextVar[Watcher | None] = ContextVar("ragen_watcher", default=None)
_UNWATCHED = Watcher()


@contextmanager
def watching(
    progress: ProgressCallback | None = None,
    started: Callable[[str], None] | None = None,
    step: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Flows called inside this block report to ``progress``, ``started`` and ``step`` (see :class:`Watcher`)."""
    token = _WATCHER.set(Watcher(progress, started, step))
    try:
        yield
    finally:
        _WATCHER.reset(token)


def named_after(parameter: str) -> Callable[[], str]:
    """A ``flow_run_name`` callable: the value of the flow's ``parameter`` (a run id) when given, control characters
    escaped (the name is set before the flow checks the id); else the run keeps the name it has until
    :func:`showing` names it after the id the flow derives."""

    def name() -> str:
        from prefect.runtime import flow_run

        value = flow_run.parameters.get(parameter)
        return escape_controls(str(value)) if value else str(flow_run.name)

    return name


def named_after_request(parameter: str) -> Callable[[], str]:
    """A ``flow_run_name`` callable: the run id (a sweep's id) of the flow's ``parameter``, a request or an admitted
    one, escaped."""

    def name() -> str:
        from prefect.runtime import flow_run

        value = flow_run.parameters[parameter]
        request = getattr(value, "request", value)
        return escape_controls(getattr(request, "run_id", None) or request.sweep_id)

    return name


def plain_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """A flow's parameters with an admitted request (or a request) in place written as the request's plain
    parameters (:meth:`ragen_core.run.requests.RunRequest.parameters`): what a deployment's form holds."""
    from ragen_core.run.procedures import Admission

    plain: dict[str, Any] = {}
    for key, value in parameters.items():
        request = value.request if isinstance(value, Admission) else value
        if callable(getattr(request, "parameters", None)) and hasattr(request, "lake"):
            plain.update(request.parameters())
        else:
            plain[key] = value
    return plain


def escape_texts(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, texts, numbers) with every text's control characters escaped, keys too."""
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {escape_texts(key): escape_texts(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_texts(item) for item in value]
    return value


class ShownFlow(Flow):
    """A Prefect flow whose parameters reach the server (the flow run's parameters in the UI) with every control
    character of their texts escaped; the function is called with them as given."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """Prefect's JSON form of the parameters (what it stores when it creates the flow run), texts escaped.
        Parameters that are JSON already (every run's, once its request is written plainly) are kept as they are:
        Prefect's own conversion imports FastAPI for it, 0.4 s of every command that runs a flow."""
        plain = plain_parameters(parameters)
        if not all(_is_json(value) for value in plain.values()):
            plain = super().serialize_parameters(plain)
        return escape_texts(plain)


def _is_json(value: Any) -> bool:
    """Whether ``value`` is JSON as it is: a text, number, bool or None, or lists and text-keyed dicts of them."""
    if value is None or type(value) in (str, bool, int, float):  # exact types: an enum's member is converted
        return True
    if type(value) is list:
        return all(_is_json(item) for item in value)
    if type(value) is dict:
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False


def flow(**options: Any) -> Callable[[Callable[..., Any]], ShownFlow]:
    """Prefect's ``@flow`` (same options), making a :class:`ShownFlow`."""
    return lambda function: ShownFlow(function, **options)


def escape_stored_parameters() -> None:
    """The first step of a flow: when the current flow run's stored parameters hold a control character (a run
    created elsewhere, with parameters as someone typed them: a deployment run from the UI or the API), store them
    escaped instead. Outside a flow run, or when nothing needs escaping: nothing."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None:
        return
    escaped = escape_texts(run.parameters)
    if escaped != run.parameters:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, parameters=escaped)


def run_tags(env: str, preset: str, sweep_id: str | None = None) -> list[str]:
    """The tags of a run's flow run: ``env:<env>``, ``preset:<preset>`` (spelled as the config spells it:
    ``starpo_s``), ``sweep:<id>``."""
    tags = [f"env:{env}", f"preset:{preset}"]
    return tags + ([f"sweep:{sweep_id}"] if sweep_id else [])


class _InRun(logging.Filter):
    """Passes only records made inside a flow or task run (the API takes no log without a flow run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.context import FlowRunContext, TaskRunContext

        return bool(getattr(record, "flow_run_id", None) or FlowRunContext.get() or TaskRunContext.get())


class _OneLine(logging.Filter):
    """Writes a record's message as one line, its control characters escaped (a path, a lock holder's command or a
    stored name holding a newline or an escape sequence reaches the flow run's logs, and the terminal, written out)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):  # a malformed record: logging reports it itself
            return True
        record.msg, record.args = escape_controls(message), None
        return True


class _QuietTaskRuns(logging.Filter):
    """Drops Prefect's "Finished in state Completed()" line of each task run (about 22 an iteration, which buried the
    iteration lines in the run's logs); a task run's failure, retry or crash is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not str(record.msg).startswith("Finished in state Completed")


TASK_RUN_LOGGER = "prefect.task_runs"
TASK_RUN_LEVEL_SETTING = "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL"  # set: the user chose what to see
_QUIET_TASK_RUNS = _QuietTaskRuns()
_API = APILogHandler()
_API.addFilter(_InRun())
_API.addFilter(_OneLine())
_SUMMARY = logging.getLogger(RUN_LOGGER)
_SUMMARY.propagate = False  # never the terminal: the command line prints its own line
_SUMMARY.setLevel(logging.INFO)


@contextmanager
def showing(name: str, tags: list[str]) -> Iterator[None]:
    """For the current flow run (none: nothing): named ``name`` and given ``tags``, its address handed to the
    watcher, and our loggers' records sent to its logs on the server until the block ends."""
    _label(name, tags)
    loggers = [logging.getLogger(n) for n in (*FORWARDED, RUN_LOGGER)]
    added = [logger for logger in loggers if _API not in logger.handlers]  # a subflow: its parent's are in place
    for logger in added:
        logger.addHandler(_API)
    task_runs = logging.getLogger(TASK_RUN_LOGGER)
    quieted = TASK_RUN_LEVEL_SETTING not in os.environ and _QUIET_TASK_RUNS not in task_runs.filters
    if quieted:
        task_runs.addFilter(_QUIET_TASK_RUNS)
    try:
        yield
    finally:
        for logger in added:
            logger.removeHandler(_API)
        if quieted:
            task_runs.removeFilter(_QUIET_TASK_RUNS)


def _label(name: str, tags: list[str]) -> None:
    """Rename and tag the current flow run on the server (one call, only when something changes), then hand the
    UI address of an outermost flow run to the watcher."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is None:
        return
    wanted = sorted(set(run.tags) | set(tags))
    if run.name != name or set(run.tags) != set(wanted):
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, name=name, tags=wanted)
        run.name, run.tags = name, wanted
    started = (_WATCHER.get() or _UNWATCHED).started
    if started is not None and run.parent_task_run_id is None:
        url = flow_run_url(run)
        if url:
            started(url)


def flow_run_url(run: Any) -> str | None:
    """The flow run's address in Prefect's UI (None when no UI address is known)."""
    from prefect.utilities.urls import url_for

    return url_for(run)


def report(iteration: int, metrics: dict[str, float]) -> None:
    """After a committed iteration: its summary line to the flow run's logs, and the watcher's ``progress``."""
    _SUMMARY.info(iteration_line(iteration, metrics))
    progress = (_WATCHER.get() or _UNWATCHED).progress
    if progress is not None:
        progress(iteration, metrics)


def step(text: str) -> None:
    """A line about a long step that is not an iteration (control characters escaped: it may quote a user's text): to
    the flow run's logs and the watcher's ``step``."""
    text = escape_controls(text)
    _SUMMARY.info(text)
    to_caller = (_WATCHER.get() or _UNWATCHED).step
    if to_caller is not None:
        to_caller(text)
