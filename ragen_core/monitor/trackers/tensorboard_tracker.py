"""The ``tensorboard`` tracker: each committed iteration as one event file of the run's TensorBoard folder
(:mod:`ragen_core.monitor.tensorboard_sink`). It has no run of its own to continue and takes no plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragen_core.monitor.tensorboard_sink import write_scalars
from ragen_core.monitor.trackers.base import TRACKERS, RunEnd, TrackerRun, TrackerSpec


class TensorBoardTracker:
    """Event files in ``runs/<run id>/tensorboard/``, one per step, each written whole."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def state(self) -> dict[str, Any]:
        return {}

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        write_scalars(self.folder, step, scalars)

    def finish(self, status: RunEnd, plot: Path | None) -> None:
        return None


def open_tensorboard(run: TrackerRun) -> TensorBoardTracker:
    """The run's TensorBoard folder (created at the first write)."""
    return TensorBoardTracker(run.lake.tensorboard_dir(run.run_id))


TRACKERS.add("tensorboard", TrackerSpec(open_tensorboard, package="tensorboard", takes_plot=False))
