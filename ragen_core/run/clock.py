"""The clock that times an iteration's stages, and the name a stage's task runs take (Prefect-free).

A stage's name is said once, in its row of the iteration's table (:data:`ragen_core.run.stages.ITERATION`): the clock
records it as the run's position (the manifest says where a failed run stopped) and times it as ``time/<stage>``;
the stage's task runs are named ``<stage>-i<iteration>`` in Prefect's UI (:func:`run_name`).

The lake names *batches*, not stages (:class:`ragen_core.storage.Stage`): the training batch ``rollout`` is made by
``generate``, staged by ``persist``, checked by ``validate`` and published by ``filter``; ``evaluate`` publishes one
``eval-<env>`` batch per validation env; ``commit`` publishes the ``commit`` batch (metrics, events, evaluations,
checkpoints rows). Those batch names are stored (staging folders, done markers, quarantine folders), so they stay.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from ragen_core.faults import set_iteration
from ragen_core.run.record import RunRecord


def run_name(stage: str) -> str:
    """The ``task_run_name`` template of a stage's task: ``<stage>-i{iteration}`` (``generate-i3`` in the UI)."""
    return f"{stage}-i{{iteration}}"


class StageClock:
    """Records where the run is (the manifest's position, if it fails) and how long each stage took
    (``time/<stage>`` into ``metrics``)."""

    def __init__(self, record: RunRecord, iteration: int, metrics: dict[str, float]) -> None:
        self.record, self.iteration, self.metrics = record, iteration, metrics
        set_iteration(iteration)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """Time the body as ``stage``; a failure inside leaves ``stage`` as the run's position."""
        self.record.position = {"iteration": self.iteration, "stage": stage}
        start = time.perf_counter()
        yield
        self.metrics[f"time/{stage}"] = time.perf_counter() - start
