"""The stages of one iteration by their one name, and the clock that times them (Prefect-free).

A stage's name is said once, here: the clock records it as the run's position (the manifest says where a failed run
stopped) and times it as ``time/<stage>``; the stage's task runs are named ``<stage>-i<iteration>`` in Prefect's UI
(``tasks/stages.py``); docs/architecture.md draws them in this order. ``tests/test_architecture_stages.py`` checks
that the flows and tasks take these names and spell none of their own.

The lake names *batches*, not stages (:class:`ragen_core.storage.Stage`): the training batch ``rollout`` is made by
``generate``, staged by ``persist``, checked by ``validate`` and published by ``filter``; ``evaluate`` publishes one
``eval-<env>`` batch per validation env; ``commit`` publishes the ``commit`` batch (metrics, events, evaluations,
checkpoints rows). Those batch names are stored (staging folders, done markers, quarantine folders), so they stay.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

from ragen_core.faults import set_iteration
from ragen_core.run.record import RunRecord


class IterationStage(StrEnum):
    """The stages of one iteration, in the order they run (``[evaluate]`` and ``[diagnose]`` when due)."""

    EVALUATE = "evaluate"  # validation rollouts of the fixed instances, per env (iteration 0, every eval.every, last)
    GENERATE = "generate"  # the training rollouts
    PERSIST = "persist"  # the batch staged as Parquet
    VALIDATE = "validate"  # the data contracts; a failing batch is quarantined
    FILTER = "filter"  # the group filter, then the batch published
    DIAGNOSE = "diagnose"  # the reasoning MI diagnostic (trainer.mi_diagnostic), before the update
    UPDATE = "update"  # the policy update on the kept rows
    COMMIT = "commit"  # checkpoint when due, metrics / events / evaluations rows, the commit marker
    ARTIFACT = "artifact"  # the metrics artifact, published in the background after the commit (not timed)
    SKIP = "skip"  # not a stage that runs: what a resume records in place of a quarantined iteration's stages

    @property
    def run_name(self) -> str:
        """The ``task_run_name`` template of the stage's task: ``<stage>-i{iteration}``."""
        return f"{self.value}-i{{iteration}}"


class StageClock:
    """Records where the run is (the manifest's position, if it fails) and how long each stage took
    (``time/<stage>`` into ``metrics``)."""

    def __init__(self, record: RunRecord, iteration: int, metrics: dict[str, float]) -> None:
        self.record, self.iteration, self.metrics = record, iteration, metrics
        set_iteration(iteration)

    @contextmanager
    def __call__(self, stage: IterationStage) -> Iterator[None]:
        """Time the body as ``stage``; a failure inside leaves ``stage`` as the run's position."""
        self.record.position = {"iteration": self.iteration, "stage": str(stage)}
        start = time.perf_counter()
        yield
        self.metrics[f"time/{stage}"] = time.perf_counter() - start
