"""Calling the user's own code (an env's ``reset`` / ``step``, a reward function) with a time limit.

A function in pure Python cannot be stopped from outside the thread it runs in, so a :class:`Watchdog` runs each
call in a worker thread while the calling thread waits for it, at most ``timeout_s`` seconds. A call still running
then is abandoned with its worker: a daemon thread, so the process, which the caller then fails cleanly, never waits
for it. The waiting thread stays where a stop reaches it: a Ctrl-C (or SIGTERM) raises in it at once, and a stop
recorded in :mod:`ragen_core.stops` whose exception never reached it (it went to the main thread, or a library
swallowed it) ends the wait too. One worker serves the calls of one watchdog (a rollout's) one after another:
handing a call over costs tens of microseconds, where starting a thread per call cost ~0.1 ms. ``timeout_s=None``
calls the function in the calling thread, with no limit (for code that must run in the main thread: ``signal.alarm``,
say).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ragen_core import stops

POLL_S = 0.05  # how often a wait looks at the stop record; a call that returns sooner ends the wait at once

Job = Callable[[], None]


class Overran(Exception):
    """The call was still running when its time was up (its worker thread is abandoned)."""


def _serve(jobs: queue.SimpleQueue[Job | None]) -> None:
    """A worker's life: the jobs handed to it, one at a time, until None."""
    while (job := jobs.get()) is not None:
        job()


class Watchdog:
    """Runs the user's calls under ``timeout_s`` each (module docstring); use it as a context manager, or call
    :meth:`close` when done, to end its worker."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[Job | None] | None = None  # the worker's queue; None: no worker (yet)

    def call(self, function: Callable[[Any], Any], argument: Any) -> tuple[bool, Any]:
        """``(True, function(argument))``, or ``(False, the exception it raised)`` (``SystemExit`` and the like
        included: what the user's code raises is the caller's to name). Raises :class:`Overran` when the call has
        not returned after ``timeout_s`` seconds, and ``KeyboardInterrupt`` when the process is asked to stop while
        it waits. ``timeout_s=None``: called in this thread, without a limit (a ``KeyboardInterrupt`` then
        propagates, as it cannot be told from a Ctrl-C)."""
        if self.timeout_s is None:
            try:
                return True, function(argument)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which names the user's code
                return False, exc
        if stops.requested():  # a stop came before: no call to start
            raise KeyboardInterrupt
        done, outcome = threading.Event(), []

        def job() -> None:
            try:
                outcome.append((True, function(argument)))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome.append((False, exc))
            finally:
                done.set()

        self._worker().put(job)
        deadline = time.monotonic() + self.timeout_s
        try:
            while not done.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))):
                if stops.requested():  # a stop whose exception did not reach this thread
                    raise KeyboardInterrupt
                if time.monotonic() >= deadline:
                    raise Overran
        except BaseException:
            self.close()  # the worker is still in the call: it ends after it, if it ever returns
            raise
        return outcome[0]

    def _worker(self) -> queue.SimpleQueue[Job | None]:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._jobs,), name="ragen-user-code", daemon=True).start()
        return self._jobs

    def close(self) -> None:
        """End the worker once it is done with its call, if any (the next call starts another)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["POLL_S", "Overran", "Watchdog"]
