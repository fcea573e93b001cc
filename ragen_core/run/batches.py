"""The batch pipeline: stage -> validate -> [filter] -> publish, one code path for every batch a run stores.

Training rollouts (filtered, then trained on), validation rollouts and a bootstrap's demonstrations all pass through
a :class:`BatchPipeline`: the records become the lake's tables and the turns are staged as Parquet (invisible to
readers), the data contracts judge the batch (the staged turns as read back, the trajectories as they will be
written; a failing batch is quarantined with a report and nothing from it is published), the group filter marks the
kept groups (training only), and the batch is published: its trajectories staged, once, with the filter's columns,
then both tables renamed into place (atomic renames) and the stage marked done with its metrics, so a resume reuses
it. An iteration runs the steps as stages of their own (``persist``, ``validate``,
``filter``: :mod:`ragen_core.run.stages`), so each is a visible, timed stage; everyone else calls
:meth:`BatchPipeline.run`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ragen_core.algos import FilterSettings, apply_filter, filter_metric
from ragen_core.algos.filters import ENTROPY_METRICS
from ragen_core.config import RunConfig
from ragen_core.envs.remote import open_env
from ragen_core.rollout import TrajectoryRecord
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from ragen_core.storage import DataLake, LakeError
from schemas.contracts import ContractReport, validate_trajectory_batch

LOGGER = logging.getLogger("ragen.monitor")
BatchMetrics = Callable[[pa.Table, pa.Table], dict[str, float]]
TrajectoryEntropy = Callable[[pa.Table], torch.Tensor]  # trajectories -> (B,) mean token entropy of each row


class BatchRejected(RuntimeError):
    """A batch failed its data contracts; it was quarantined and nothing from it was trained on.

    ``checks`` holds the stable names of the failed checks, ``quarantine`` the folder with the batch and report.json.
    """

    def __init__(self, message: str, checks: list[str] | None = None, quarantine: str | None = None) -> None:
        super().__init__(message)
        self.checks = checks or []
        self.quarantine = quarantine


@dataclass(frozen=True)
class BatchRules:
    """What a batch of one env is checked against: groups of ``group_size``, scores within ``bounds``, and the env's
    reward -> success rule (None: the env has none)."""

    group_size: int
    bounds: tuple[float, float]
    success_rule: Callable[[float], bool | None] | None = None
    staleness: int = 0  # iteration - policy_version of every row lies in [0, staleness]

    @classmethod
    def of(cls, config: RunConfig, env_name: str, group_size: int, staleness: int = 0) -> BatchRules:
        """The rules of ``env_name`` under the config's limits: env reward bounds plus the worst format penalties;
        ``staleness``: how much older than its iteration a row's policy may be (training batches of an async run:
        its schedule's k)."""
        env = open_env(env_name, config.env.options, config.env.remote_for(env_name), config.env.user_code_timeout_s)
        low, high = env.reward_bounds(config.env.max_actions_per_traj)
        bounds = (low + config.env.max_turns * config.rollout.format_penalty, high)
        return cls(group_size, bounds, env.success_from_reward, staleness)


class BatchPipeline:
    """One batch of one stage (``meta``: its run, iteration, split; ``stage``: a :class:`ragen_core.storage.Stage`
    name) on its way into the lake."""

    def __init__(self, lake: DataLake, meta: BatchMeta, stage: str, rules: BatchRules) -> None:
        self.lake, self.meta, self.stage, self.rules = lake, meta, stage, rules
        self._trajectories: pa.Table | None = None  # held until the filter's columns are in: written once
        self._checked: tuple[pa.Table, pa.Table] | None = None  # the batch as validated
        self._written = False

    def __repr__(self) -> str:
        return f"BatchPipeline({self.meta.run_id}/{self.meta.iteration}/{self.stage})"

    def run(self, records: list[TrajectoryRecord], metrics: BatchMetrics | None = None) -> dict[str, float]:
        """stage -> validate -> publish (no filter: every group is kept as it is); returns the batch's metrics."""
        self.persist(records)
        self.validate()
        return self.publish(metrics)

    def persist(self, records: list[TrajectoryRecord]) -> dict[str, Any]:
        """The batch as the lake's ``trajectories`` and ``turns`` tables (:meth:`persist_tables`)."""
        self.persist_tables(trajectories_table(records, self.meta), turns_table(records, self.meta))
        return {"trajectories": len(records), "turns": sum(len(r.turns) for r in records)}

    def persist_tables(self, trajectories: pa.Table, turns: pa.Table) -> None:
        """Stage the batch's ``turns`` (deterministic names: a redo overwrites; nothing later changes them) and hold
        its ``trajectories`` until :meth:`publish` writes them with the filter's columns, so each is written once.
        The trajectories may break the lake's contracts: :meth:`validate` judges them."""
        self._trajectories, self._checked, self._written = trajectories, None, False
        self.lake.stage_table(self.meta.run_id, self.meta.iteration, self.stage, "turns", turns)

    def validate(self) -> dict[str, Any]:
        """The data contracts of :mod:`schemas.contracts` on the batch, the turns as staged and read back
        (vectorised on every batch; pandera and great-expectations re-check a rejected one); a failing or unreadable
        batch is moved to quarantine (its trajectories staged beside its turns) with a machine-readable report.json
        and :class:`BatchRejected`."""
        run_id, iteration, rules = self.meta.run_id, self.meta.iteration, self.rules
        self._checked = None
        trajectories = self._held()
        try:
            turns = self.lake.read_staged(run_id, iteration, self.stage, "turns")
        except LakeError as exc:
            report = ContractReport()
            report.add("storage", "staged_batch_readable", detail=str(exc))
        else:
            report = validate_trajectory_batch(
                trajectories,
                turns,
                rules.group_size,
                rules.bounds,
                success_rule=rules.success_rule,
                max_staleness=rules.staleness,
            )
        if not report.ok:
            self.lake.stage_table(run_id, iteration, self.stage, "trajectories", trajectories, strict=False)
            context = {"run_id": run_id, "iteration": iteration, "stage": self.stage, "group_size": rules.group_size}
            report_json = report.to_json(**context, reward_bounds=list(rules.bounds))
            where = self.lake.quarantine(run_id, iteration, self.stage, report_json)
            checks = report.failed_checks()
            raise BatchRejected(
                f"batch {run_id}/{iteration}/{self.stage} failed checks {', '.join(checks)}; "
                f"quarantined in {where} (see report.json); nothing from it is trained on",
                checks,
                str(where),
            )
        self._checked = (trajectories, turns)
        return {"rows": trajectories.num_rows, "checks": "passed"}

    def filter(self, algorithm: FilterSettings, entropy: TrajectoryEntropy | None = None) -> None:
        """The group filter of the ``algorithm`` config section (``filter`` and its options) sets
        ``group_reward_std``, ``filter_metric_value`` and ``kept`` of the validated trajectories (written by
        :meth:`publish`); ``entropy`` (the entropy metrics with ``algorithm.filter_entropy=full``) gives each
        trajectory's entropy instead of the stored log-probs' estimate."""
        trajectories, turns = self.checked()
        decision = apply_filter(algorithm, *filter_inputs(trajectories, filter_metric(algorithm), entropy))
        for name, values, kind in (
            ("group_reward_std", decision.group_reward_std.numpy(), pa.float64()),
            ("filter_metric_value", decision.metric_value.numpy(), pa.float64()),
            ("kept", decision.kept.numpy(), pa.bool_()),
        ):
            index = trajectories.schema.get_field_index(name)
            trajectories = trajectories.set_column(index, trajectories.schema.field(name), pa.array(values, kind))
        self._checked = (trajectories, turns)
        if not bool(decision.kept.any()):
            LOGGER.warning(
                "run %s iteration %d: the filter kept no group; the update is skipped",
                self.meta.run_id,
                self.meta.iteration,
            )

    def write(self) -> None:
        """Stage the validated (and filtered) trajectories: the one write of the batch's trajectories (again: a
        no-op)."""
        if not self._written:
            trajectories, _ = self.checked()
            self.lake.stage_table(self.meta.run_id, self.meta.iteration, self.stage, "trajectories", trajectories)
            self._written = True

    def publish(self, metrics: BatchMetrics | None = None) -> dict[str, float]:
        """Write the trajectories (:meth:`write`), publish the staged batch (one atomic rename per file) and mark the
        stage done with ``metrics`` of it (a resume reuses a published batch and its metrics instead of
        regenerating it)."""
        run_id, iteration = self.meta.run_id, self.meta.iteration
        values = metrics(*self.checked()) if metrics is not None else {}
        self.write()
        self.lake.publish(run_id, iteration, self.stage)
        self.lake.mark_stage_done(run_id, iteration, self.stage, {"metrics": values})
        return values

    def checked(self) -> tuple[pa.Table, pa.Table]:
        """The batch as :meth:`validate` judged it (with the filter's columns once filtered)."""
        if self._checked is None:
            raise RuntimeError(f"{self!r} has not been validated: validate() judges the persisted batch first")
        return self._checked

    def _held(self) -> pa.Table:
        if self._trajectories is None:
            raise RuntimeError(f"{self!r} has nothing to validate: persist() makes the batch's tables first")
        return self._trajectories


def filter_inputs(
    trajectories: pa.Table, metric: str, full_entropy: TrajectoryEntropy | None = None
) -> tuple[torch.Tensor, ...]:
    """(group index, scores, entropy, length) per trajectory for the filter. The entropy (only computed for the
    entropy metrics) is ``full_entropy(trajectories)`` when given, else the estimate
    ``-sum(behavior_logprobs) / response_length``, the mean negative log-prob the sampler gave its own tokens (the
    log-probs are 0 off the loss mask)."""
    groups = torch.tensor(trajectories["group_id"].to_numpy(), dtype=torch.long)
    scores = torch.tensor(trajectories["total_reward"].to_numpy(), dtype=torch.float64)
    length = torch.tensor(trajectories["response_length"].to_numpy(), dtype=torch.float64)
    entropy = None
    if metric in ENTROPY_METRICS and full_entropy is not None:
        entropy = full_entropy(trajectories).double()
    elif metric in ENTROPY_METRICS:
        logprobs = trajectories["behavior_logprobs"]
        if logprobs.null_count:
            raise ValueError(f"filter metric {metric!r} needs behaviour log-probs, and scripted rows have none")
        parents = pc.list_parent_indices(logprobs).to_numpy()
        flat = pc.list_flatten(logprobs).to_numpy().astype(np.float64)
        sums = np.bincount(parents, weights=-flat, minlength=trajectories.num_rows)
        entropy = torch.tensor(sums) / length.clamp(min=1.0)
    return groups, scores, entropy, length
