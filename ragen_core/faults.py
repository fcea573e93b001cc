"""Fault injection for resume tests: ``RAGEN_FAULT=<stage>:<point>`` makes the process SIGKILL itself there.

Stages call :func:`maybe_fail` at the places a real failure could hit (inside rollout, mid Parquet write, after
publish, inside the update, mid checkpoint save), so tests kill the run at exact points instead of relying on timers.
An optional ``@<iteration>`` suffix (``RAGEN_FAULT=update:inside@2``) fires only at that iteration.
"""

from __future__ import annotations

import os
import signal
import sys

ENV_VAR = "RAGEN_FAULT"
_current_iteration: int | None = None


def set_iteration(iteration: int | None) -> None:
    """The iteration now running (for fault points that do not know it, such as a Parquet write)."""
    global _current_iteration
    _current_iteration = iteration


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
    if fault_matches(os.environ.get(ENV_VAR), stage, point, _current_iteration if iteration is None else iteration):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
