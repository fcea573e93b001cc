"""Fault injection for resume tests: ``RAGEN_FAULT=<stage>:<point>`` makes the process SIGKILL itself there (or, at
a :func:`maybe_kill_helper` place, a helper process it started: the vLLM rollout server).

Stages call :func:`maybe_fail` at the places a real failure could hit (inside rollout, mid Parquet write, after
publish, inside the update, mid checkpoint save), so tests kill the run at exact points instead of relying on timers.
An optional ``@<iteration>`` suffix (``RAGEN_FAULT=update:inside@2``) fires only at that iteration.
"""

from __future__ import annotations

import os
import signal
import sys
from contextvars import ContextVar

ENV_VAR = "RAGEN_FAULT"
# per context: an async run's sampler lane (a thread in a copied context) runs another iteration than its learner
_current_iteration: ContextVar[int | None] = ContextVar("ragen_fault_iteration", default=None)


def set_iteration(iteration: int | None) -> None:
    """The iteration now running in this context (for fault points that do not know it, such as a Parquet write)."""
    _current_iteration.set(iteration)


def fault_matches(spec: str | None, stage: str, point: str, iteration: int | None) -> bool:
    """Whether the fault spec ``stage:point[@iteration]`` names this place."""
    if not spec:
        return False
    place, _, at = spec.partition("@")
    if place != f"{stage}:{point}":
        return False
    return not at or (iteration is not None and int(at) == iteration)


def maybe_fail(stage: str, point: str, iteration: int | None = None) -> None:
    """SIGKILL this process when ``RAGEN_FAULT`` names this place (no clean-up, no exception: a real crash)."""
    at = _current_iteration.get() if iteration is None else iteration
    if fault_matches(os.environ.get(ENV_VAR), stage, point, at):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_kill_helper(stage: str, point: str, group: int, iteration: int | None = None) -> bool:
    """SIGKILL the process group ``group`` (a helper this process started in a group of its own, such as the vLLM
    server) when ``RAGEN_FAULT`` names this place: the helper dies under a running process, which goes on and meets
    the failure as it would a real crash of the helper. Returns whether it fired."""
    at = _current_iteration.get() if iteration is None else iteration
    if not fault_matches(os.environ.get(ENV_VAR), stage, point, at):
        return False
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True
