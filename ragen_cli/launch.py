"""What a ``ragen`` command that runs a flow sets up first: Prefect's environment, quiet libraries, the run's writer
lock, and which errors are the user's (one line on stderr) rather than bugs (a traceback)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from ragen_cli.common import console, fail, printable, shown

if TYPE_CHECKING:
    from ragen_core.config import RunConfig
    from ragen_core.run.procedures import Admission, Request
    from ragen_core.storage import DataLake

# whether the user pointed the command at a Prefect server (PREFECT_API_URL), and whether the command started its own
_SERVER = {"configured": False, "own": False}


def start_flow_command(lake: DataLake, name: str, verbose: bool) -> None:
    """Prefect's environment (its own home and server in ``lake`` for ``name``), then, unless ``verbose``, the
    libraries quieted and Prefect's run logs kept off the terminal (the command reports progress and errors itself)
    while they still reach the server."""
    _SERVER["configured"] = "PREFECT_API_URL" in os.environ
    _prepare_prefect(lake, name, verbose)
    if not verbose:
        _quiet_libraries()
        import prefect.main  # noqa: F401  (importing it sets up Prefect's logging: the handlers the filter goes on)

        _hide_run_logs()


@contextmanager
def watch_run(
    progress: Callable[[int, dict[str, float]], None] | None = None, step: Callable[[str], None] | None = None
) -> Iterator[None]:
    """The context to call a flow in: ``progress`` after each iteration, ``step`` with a line about a long step that
    is not one (printed by default), and the flow run's address in Prefect's UI printed once it is known, when the
    user configured the server (a command's temporary server has no UI and stops with the command: no address)."""
    from flows.ui import watching

    with _heartbeats(), watching(progress, _print_address if _SERVER["configured"] else None, step or print_step):
        yield


def _heartbeats() -> AbstractContextManager[object]:
    """Prefect's flow-run heartbeats (an event every 180 s) tell a server that a run is still alive. On the command's
    own temporary server nobody can read them (it stops with the command), and they cost each flow run up to a second
    at its end, where Prefect waits for the heartbeat thread to wake (ten empty flow runs: 11.2 s with them, 1.4 s
    without; a sweep's every point is a flow run). So they are off there, and on wherever the user's server runs."""
    if not _SERVER["own"]:
        return nullcontext()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def print_step(text: str, target: Console | None = None) -> None:
    """A step's line, literal (control characters written out), on ``target`` (default: the command's console)."""
    (target or console).print(Text(printable(text)), highlight=False)


@contextmanager
def watch_points() -> Iterator[None]:
    """The context to call a sweep in: a line as each point starts and ends, and under them a live line with the
    running point's last iteration (on a terminal; it leaves nothing behind)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ragen_core.monitor.reports import iteration_line

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as live:
        status = live.add_task("starting", total=None)

        def on_step(text: str) -> None:
            print_step(text, live.console)
            live.reset(status, description="starting")

        def on_iteration(iteration: int, metrics: dict[str, float]) -> None:
            live.update(status, description=printable(iteration_line(iteration, metrics)))

        with watch_run(on_iteration, on_step):
            yield


def _print_address(url: str) -> None:
    console.print(Text.assemble("Prefect UI: ", printable(url)), highlight=False, soft_wrap=True)


def _prepare_prefect(lake: DataLake, run_id: str, verbose: bool) -> None:
    """Environment for Prefect, set before it is imported: no telemetry, a patient local server, and a Prefect home
    of the run's own attempt when no server is configured (two runs, or a resume and the server a killed attempt may
    have left behind, never share one SQLite file)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if "PREFECT_API_URL" not in os.environ and "PREFECT_HOME" not in os.environ:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        home = lake.prefect_home(run_id) / f"{stamp}-{os.getpid()}"
        home.mkdir(parents=True, exist_ok=True)  # Prefect creates only the last level itself
        os.environ["PREFECT_HOME"] = str(home)
        from ragen_cli.interrupts import start_command_server

        start_command_server(home)  # its own server: out of reach of the terminal's Ctrl-C, dead with this process
        _SERVER["own"] = True


@contextmanager
def admitted(request: Request) -> Iterator[Admission]:
    """``request`` admitted for the whole command (:func:`ragen_core.run.procedures.admit`: its run's writer lock
    taken before anything is written or started, a training run's start decided); the flow the command calls runs
    the admission as it is. A refusal (another process writes the run, a config the stored run refuses) is a user
    error."""
    from ragen_core.run.decisions import ResumeError
    from ragen_core.run.procedures import admit
    from ragen_core.storage import LakeError

    with ExitStack() as stack:
        try:
            admission = stack.enter_context(admit(request))
        except (LakeError, ResumeError) as exc:
            fail(str(exc))
        note = admission.run.takeover_note
        if note:
            console.print(f"[yellow]note:[/] {shown(note)}")
        yield admission


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _quiet_deepspeed()
    for name in ("great_expectations", "DeepSpeed", "deepspeed", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # this module sets its own logger to INFO when imported (after us) and says "Created temporary directory" on
    # the terminal at every run; a filter on the logger outlives that
    logging.getLogger("great_expectations.data_context.types.base").addFilter(
        lambda record: record.levelno >= logging.ERROR
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _quiet_deepspeed() -> None:
    """DeepSpeed's two lines on every command: the accelerator warning it logs at import when none is named (named
    here: the CPU when torch sees no GPU, which is what it would pick) and the "built successfully" it prints each time
    it loads its CPU comm op (the load itself stays; --verbose shows both)."""
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"
    import contextlib
    import importlib
    import io

    # by module path: `import deepspeed.comm.torch as x` binds the package's attribute `torch`, which is torch itself
    deepspeed_torch = importlib.import_module("deepspeed.comm.torch")

    loud = deepspeed_torch.build_shm_op
    if getattr(loud, "_ragen_quiet", False):
        return

    def build_shm_op():  # noqa: ANN202 - DeepSpeed's own function, wrapped
        with contextlib.redirect_stdout(io.StringIO()):
            return loud()

    build_shm_op._ragen_quiet = True
    deepspeed_torch.build_shm_op = build_shm_op


def user_facing_errors() -> tuple[type[BaseException], ...]:
    """Errors about the user's data, setup or code (a damaged lake or checkpoint, a missing model, a vLLM server or
    an async run's sampler process that cannot start or died: its message names its log; an update group on several
    nodes that did not come up or lost a node; a batch about to be sampled by another policy version than the
    schedule's, refused before its rows are stored, or a resume lacking a batch only a policy gone since could
    sample; an env or reward function of the user's own that raised or returned the wrong thing; a model whose chat
    template cannot carry a tool env's chat token-exactly): their message says what is wrong and what to do, so the
    command prints it alone. Anything else is a bug and keeps its traceback."""
    from ragen_core.agent import TemplateError
    from ragen_core.envs.external import UserCodeError
    from ragen_core.policy.loading import PolicyLoadError
    from ragen_core.rollout.sampler import SamplerError
    from ragen_core.rollout.sampling import PolicyVersionError
    from ragen_core.rollout.vllm_client import BackendUnavailable, VLLMServerError
    from ragen_core.run.overlap import MissingBatchError
    from ragen_core.storage import LakeError
    from ragen_core.training.checkpoint import CheckpointError
    from ragen_core.training.group import GroupNodeError

    errors = LakeError, PolicyLoadError, CheckpointError, BackendUnavailable, VLLMServerError, UserCodeError
    return (*errors, SamplerError, TemplateError, PolicyVersionError, GroupNodeError, MissingBatchError)


RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class _NoRunRecords(logging.Filter):
    """Keeps Prefect's records about flow and task runs off the terminal, but their warnings: the info lines (a run
    created, renamed, finished) and the errors about failed runs (each with the traceback; the command reports the
    error itself). The same for the engine's "Crash detected!" line, which Prefect logs under ``prefect.engine`` when
    the run context is already gone (a SIGTERM caught by Prefect's own handler, say): the command reports the stop or
    the error in its own line. The Prefect server still receives them all, and --verbose shows them."""

    def filter(self, record: logging.LogRecord) -> bool:
        runs = record.name.startswith(RUN_LOGGERS)
        if runs and (record.levelno < logging.WARNING or record.levelno >= logging.ERROR):
            return False
        crash = record.name == "prefect.engine" and record.levelno >= logging.ERROR
        return not (crash and str(record.msg).startswith("Crash detected!"))


def _hide_run_logs() -> None:
    """Prefect's run loggers at INFO (the quiet PREFECT_LOGGING_LEVEL=WARNING would keep their lines from the
    server's logs too), and :class:`_NoRunRecords` on every handler that writes to the terminal (Prefect set them up
    when it was imported). A log line the server fails to store (its disk full, say) is not the run's failure: the
    log sender's "--- Error logging to API ---" stays off the terminal (Python's production setting,
    ``logging.raiseExceptions = False``); the command reports the run's own errors, and --verbose shows those too."""
    from ragen_cli.interrupts import terminal_handlers

    for name in RUN_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    for handler in terminal_handlers([logging.getLogger()]):
        handler.addFilter(_NoRunRecords())
    logging.raiseExceptions = False


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, as torch and a container's limit see them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def overlap_hint(config: RunConfig, cores: int, load: float) -> str | None:
    """A note for an async run (``trainer.max_staleness >= 1``) with the Hugging Face sampler process, when the
    machine cannot run its two lanes side by side: fewer free cores (``cores`` less the one-minute ``load``) than the
    learner's threads (``trainer.num_threads``; torch's default: every core) and the sampler's
    (``rollout.sampler_threads``) together. The lanes then take turns on the cores and the overlap gains little; the
    note says what to set. None when they fit, or when the run is synchronous or samples elsewhere (a vLLM server)."""
    from ragen_core.run.schedule import Schedule

    schedule = Schedule.of(config)
    if not schedule.samples_beside_learner or config.rollout.backend != "hf":
        return None
    learner = config.trainer.num_threads or cores
    sampler = config.rollout.sampler_threads
    free = max(cores - load, 0.0)
    if learner + sampler <= free + 0.5:  # half a core of noise is still room
        return None
    return (
        f"trainer.max_staleness={schedule.staleness} overlaps two lanes, the learner "
        f"(trainer.num_threads={config.trainer.num_threads or f'torch default, {cores}'}) and the sampler process "
        f"(rollout.sampler_threads={sampler}): {learner + sampler} threads, and this machine has {free:.1f} free "
        f"core(s) of {cores} (one-minute load {load:.1f}), so the lanes will mostly take turns and the run gains "
        "little over a synchronous one; on 2 idle cores trainer.num_threads=1 with rollout.sampler_threads=1 "
        'overlaps (docs/async.md, "Threads and cores")'
    )
