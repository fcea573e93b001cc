"""A run's schedule: which policy samples which training batch, chosen once from the config (Prefect-free, light).

``trainer.max_staleness`` = k is read here and nowhere else that decides a run's course
(tests/test_architecture_schedule.py). :class:`Schedule` is synchronous (k = 0: batch i is sampled by the policy after
update i, the iteration's rows run in table order) or overlapped (k >= 1: batch i by the policy after update i - k,
sampled in a lane of its own beside the learner's: :mod:`ragen_core.run.overlap`). A session holds the schedule it was
opened with (``session.schedule``); what a resume decides before a session exists asks :meth:`Schedule.of` of the
same config. The schedule owns:

- which loop runs the iterations (:func:`ragen_core.run.overlap.run_iterations`);
- when new weights reach the sampler (:attr:`Schedule.syncs_after_update`: after each update, or at the hand-off);
- whether the rollout side opens a sampler of its own beside the learner (:attr:`Schedule.samples_beside_learner`);
- the batches sampled ahead that a resume keeps (:meth:`Schedule.batches_ahead`), what a resume or an extension
  cannot do (:meth:`Schedule.extension_refusal`, :meth:`Schedule.skip_refusal`);
- the lanes, derived from the iteration's table (each row says its :class:`Lane`), and what an overlapped run
  refuses, derived from the rows that say why they cannot run beside the learner (:class:`SyncOnly`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the rows' module imports torch; the schedule is asked before a session exists
    from ragen_core.config import RunConfig
    from ragen_core.run.iteration import Step


class Lane(str, Enum):
    """Where a row of the iteration's table runs in an overlapped schedule (a synchronous one runs every row in
    table order). ``sampler``: it makes the training batch (batch n + k, in the sampler's lane); ``learner``: it
    works on the learner's policy (its validation, its update of batch n); ``commit``: it ends step n once both
    lanes have (after the hand-off)."""

    SAMPLER = "sampler"
    LEARNER = "learner"
    COMMIT = "commit"


@dataclass(frozen=True)
class SyncOnly:
    """A row an overlapped schedule cannot run, and why: ``switch``, the dotted config key (a bool) that turns the
    row on; ``needs``, what the row does that an async run cannot (the refusal's words after the key). A config that
    turns the row on in an async run is refused before anything runs (:meth:`Schedule.refusals`)."""

    switch: str
    needs: str


def sampling_version(iteration: int, staleness: int) -> int:
    """The policy version (updates received) that samples ``iteration``'s training batch: the policy after update
    ``iteration - staleness``, the start policy for the first ``staleness`` batches (0: its own)."""
    return max(0, iteration - staleness)


@dataclass(frozen=True)
class Schedule:
    """Synchronous (``staleness`` 0) or overlapped by ``staleness`` = k >= 1 batches."""

    staleness: int = 0

    @classmethod
    def of(cls, config: RunConfig) -> Schedule:
        """The schedule ``trainer.max_staleness`` asks for."""
        return cls(config.trainer.max_staleness)

    @property
    def overlapped(self) -> bool:
        """Whether batches are sampled ahead, beside the learner's update (k >= 1)."""
        return self.staleness > 0

    @property
    def syncs_after_update(self) -> bool:
        """Whether the rollout side takes the new weights right after an update (synchronous), rather than at the
        hand-off after the step's sampling (overlapped: it still samples batch n + k with the old ones)."""
        return not self.overlapped

    @property
    def samples_beside_learner(self) -> bool:
        """Whether the training batches are sampled while the learner updates: the rollout side then gives them a
        sampler that holds weights of its own (the Hugging Face backend's sampler process)."""
        return self.overlapped

    def sampling_version(self, iteration: int) -> int:
        """The policy version that samples ``iteration``'s training batch (:func:`sampling_version`)."""
        return sampling_version(iteration, self.staleness)

    def batches_ahead(self, next_iteration: int, iterations: int) -> range:
        """The iterations after ``next_iteration`` whose training batches a resume there keeps and uses (k - 1 of
        them): the commit of ``next_iteration - 1`` waited for them, and the policies that sampled them are gone.
        Empty for a synchronous run."""
        end = min(next_iteration + self.staleness, iterations)
        return range(next_iteration + 1, max(end, next_iteration + 1))

    def sampled_ahead(self, next_iteration: int) -> range:
        """The iterations after ``next_iteration`` whose batches the lanes may have sampled ahead (k of them): a
        quarantined one is refused on resume."""
        return range(next_iteration + 1, next_iteration + 1 + self.staleness)

    def extension_refusal(self, run_id: str, final: int) -> str | None:
        """Why a completed run whose final validation is iteration ``final`` cannot be given more iterations under
        this schedule (None: it can)."""
        if not self.overlapped:
            return None
        return (
            f"run {run_id!r} cannot be extended asynchronously (trainer.max_staleness={self.staleness}): its "
            f"iterations {final}..{final + self.staleness - 1} would train on batches sampled by policies before its "
            "last, which are gone. Start a new run from its last checkpoint (model.path=...), or extend it "
            "synchronously with --force-config trainer.max_staleness and trainer.max_staleness=0"
        )

    def skip_refusal(self, run_id: str, iteration: int, quarantined: str) -> str | None:
        """Why a resume cannot skip the quarantined ``iteration`` under this schedule (None: it can)."""
        if not self.overlapped:
            return None
        return (
            f"iteration {iteration} of run {run_id!r} was quarantined ({quarantined}); an async run "
            f"(trainer.max_staleness={self.staleness}) cannot skip an iteration: the batches after it were to be "
            "sampled by policies it never made. Fix the cause (environment, reward bounds, contracts), then resume"
        )

    def lanes(self, table: Sequence[Step]) -> dict[Lane, tuple[Step, ...]]:
        """The rows of ``table`` by lane, each lane in table order; a row an overlapped run cannot run (a
        :class:`SyncOnly` row) is in none. Raises ``ValueError`` for a row that names no lane: a new stage runs in
        both schedules, or says where."""
        unplaced = [step.stage for step in table if not isinstance(step.lane, Lane)]
        if unplaced:
            raise ValueError(
                f"the iteration's rows {unplaced} name no lane: give each Step a lane= (Lane.SAMPLER, Lane.LEARNER "
                "or Lane.COMMIT), so that an async run runs it too (docs/architecture.md, 'Where to add')"
            )
        return {lane: tuple(s for s in table if s.lane is lane and s.sync_only is None) for lane in Lane}

    def refusals(self, config: Any, table: Sequence[Step]) -> list[str]:
        """What an overlapped run of ``config`` cannot do, one line each: every :class:`SyncOnly` row of ``table``
        whose switch the config turns on. None for a synchronous run."""
        if not self.overlapped:
            return []
        tree = config.to_dict()
        return [
            f"{step.sync_only.switch} {step.sync_only.needs} (trainer.max_staleness={self.staleness}): set "
            f"trainer.max_staleness=0 to run the {step.stage} stage"
            for step in table
            if step.sync_only is not None and _switched_on(tree, step.sync_only.switch)
        ]


def _switched_on(tree: dict[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` of a config tree holds a true value (a missing key is off)."""
    value: Any = tree
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return bool(value)
