"""Ctrl-C (and SIGTERM) for the ``ragen`` command line: the first one stops the command cleanly, a second one forces
it. SIGTERM (a scheduler's or ``kill``'s stop) is handled as Ctrl-C is, with exit status 143.

The first SIGINT mutes the console output of the libraries' loggers (Prefect would print its "crash detected"
reports; the Prefect server still receives them) and raises :class:`KeyboardInterrupt` as Python does by default, so
the flow records where the run stopped, closes its engines and reports to the Prefect server, and the command prints
one line and exits with status 130 (skipping the interpreter's slow finalization). A second SIGINT while that clean
stop runs calls the registered last-resort cleanups (stop the temporary Prefect server) and exits at once, with
status 130 too.

A first stop that lands while a module is being imported is raised once the import is done (looked at again every
``DEFER_S``): an exception thrown through an extension module's initialisation (DuckDB's nanobind bindings) aborts
the whole process (SIGABRT) instead of stopping it.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ragen_core import stops

if TYPE_CHECKING:
    from ragen_core.storage import DataLake

_state: dict[str, bool | int] = {"reported": False, "signal": signal.SIGINT}  # whether a stop came: ragen_core.stops
DEFER_S = 0.05  # how often a stop deferred by an import looks again
_last_resort: list[Callable[[], None]] = []


def install() -> None:
    """Handle SIGINT and SIGTERM as described in the module docstring (call it from the main thread, before the
    command)."""
    signal.signal(signal.SIGINT, _on_stop_signal)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    atexit.register(_skip_finalization)  # registered first, so it runs after every other exit handler


def exit_code() -> int:
    """128 + the number of the signal that stopped the command (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(_state["signal"])


def signal_name() -> str:
    """How the stop came, for the command's one line: "Ctrl-C" or "SIGTERM"."""
    return "Ctrl-C" if _state["signal"] == signal.SIGINT else signal.Signals(_state["signal"]).name


def _skip_finalization() -> None:
    """After a Ctrl-C, once the exit handlers ran (Prefect's reports, the temporary server stopped), end the process
    without the interpreter's finalization: tearing down torch and DeepSpeed takes seconds (over ten on a loaded
    machine) and has nothing left to save."""
    if stops.requested():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(exit_code())


def on_forced_stop(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` when a second Ctrl-C forces the command to stop (atexit handlers do not run then)."""
    _last_resort.append(cleanup)


def note_stop(exc: BaseException) -> None:
    """A stop signal the orchestration layer caught before our handler did (Prefect turns a SIGTERM that lands inside
    a flow run into its own exception carrying the ``signal``) counts as that signal: the command then reports and
    exits as for it (143 for SIGTERM), not as for a Ctrl-C."""
    if stops.requested():
        return
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        signum = getattr(current, "signal", None)
        if signum in (signal.SIGINT, signal.SIGTERM):
            _state["signal"] = int(signum)
            stops.request()
            return
        seen.add(id(current))
        current = current.__cause__ or current.__context__


def note_signal(signum: int) -> None:
    """A stop signal a command passed on to a child instead of stopping itself (``ragen group join``): the command
    reports and exits as for it (130 for Ctrl-C, 143 for SIGTERM)."""
    _state["signal"] = int(signum)
    stops.request()


def requested() -> bool:
    """Whether a Ctrl-C arrived."""
    return stops.requested()


def report(message: str) -> None:
    """Print the command's one line about the stop on stderr (once; later calls are ignored)."""
    if _state["reported"]:
        return
    _state["reported"] = True
    from ragen_cli.common import err_console

    err_console.print(message, markup=False, highlight=False, soft_wrap=True)


def _importing(frame: FrameType | None) -> bool:
    """Whether the main thread is inside an import (a frame of importlib's bootstrap on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _look_again(signum: int) -> None:
    """In DEFER_S, hand the deferred stop to the main thread's handler again: the same signal, sent to the main
    thread (a real one, which also wakes a blocking call there), marked as the deferred one."""
    main = threading.main_thread().ident

    def later() -> None:
        _state["deferred"] = True
        signal.pthread_kill(main, signum)

    timer = threading.Timer(DEFER_S, later)
    timer.daemon = True
    timer.start()


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    if _state.pop("deferred", False):  # the stop an import deferred, handed back: raise it unless one still runs
        if _importing(frame):
            _look_again(signum)
            return
        raise KeyboardInterrupt
    if stops.requested():
        os.write(
            2,
            f"\nsecond {signal_name()}: stopping now, without cleaning up (`ragen resume` continues the "
            "run)\n".encode(),
        )
        for cleanup in _last_resort:
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - best effort on the way out; nothing may keep us from exiting
                pass
        os._exit(exit_code())
    _state["signal"] = signum
    stops.request()  # kept even where a library swallows the exception below (the core's long waits look here)
    mute_console_logs()
    if _importing(frame):
        _look_again(signum)
        return
    raise KeyboardInterrupt


def terminal_handlers(loggers: list[logging.Logger]) -> list[logging.Handler]:
    """The handlers of ``loggers`` that write to the terminal (stdout/stderr); not those that ship logs elsewhere
    (Prefect's API handler, files)."""
    terminal = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if stream}
    return [
        handler
        for logger in loggers
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler) and id(getattr(handler, "stream", None)) in terminal
    ]


def mute_console_logs() -> None:
    """Silence every logging handler that writes to the terminal; the others keep working."""
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    for handler in terminal_handlers(loggers):
        handler.setLevel(logging.CRITICAL + 1)


def start_command_server(home: Path) -> None:
    """Start the command's own temporary Prefect server (:func:`ragen_cli.local_server.start_temporary`: out of reach
    of the terminal's Ctrl-C, dead with this process) and point Prefect at it; it is stopped when the command exits,
    after Prefect's own exit handlers (registered later, so run earlier) have reported to it."""
    import atexit

    from ragen_cli.common import fail
    from ragen_cli.local_server import ServerError, start_temporary

    try:
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
    except ValueError:
        timeout = 180.0
    try:
        server = start_temporary(home, timeout)
    except ServerError as exc:
        fail(str(exc))
    os.environ["PREFECT_API_URL"] = server.api_url
    atexit.register(server.stop)
    on_forced_stop(lambda: server.stop(grace=1))


def report_interrupted(lake: DataLake, run_id: str) -> None:
    """The one line of a Ctrl-C'd run: where it stopped (from its manifest) and how to continue it; or that it had
    completed (a stop while it closed, after its last commit: nothing to continue)."""
    from ragen_core.storage import LakeError

    try:
        manifest = lake.read_manifest(run_id)
    except (LakeError, OSError, ValueError):
        manifest = None
    iteration, stage, last = None, None, None
    if manifest is not None:
        iteration, stage = manifest.interrupted_iteration, manifest.interrupted_stage
        last = manifest.last_committed_iteration
    if manifest is not None and manifest.status == "completed":  # the stop came once everything was committed
        report(f"interrupted: run {run_id} had completed (last committed iteration: {last}); nothing to continue")
        return
    where = ""
    if iteration is not None and (last is None or iteration > last):  # not when it came after the commit
        where = f" in iteration {iteration} ({stage})"
    committed = f"last committed iteration: {last}" if last is not None else "no iteration committed yet"
    report(
        f"interrupted: run {run_id} stopped{where}; {committed}. Continue it with: ragen resume {run_id} "
        f"--data-root {lake.root}"
    )
