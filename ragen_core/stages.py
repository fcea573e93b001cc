"""The stages of one StarPO iteration, as plain functions over a :class:`RunSession` (Prefect-free).

generate -> persist -> validate -> filter (+ publish) -> [diagnose] -> update -> commit; validation rollouts
(evaluate) run at iterations 0, every ``eval.every`` and after the last update, so ``split='val'`` rows of iteration
i measure the policy after i updates. ``diagnose`` (``trainer.mi_diagnostic``) scores the input-reasoning mutual
information of the batch with the policy that sampled it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ragen_core.algos import FilterSpec, apply_filter
from ragen_core.config import RunConfig
from ragen_core.diagnostics import first_turn_reasoning, model_scorer, reasoning_mi
from ragen_core.envs import make_env
from ragen_core.faults import maybe_fail
from ragen_core.metrics import (
    collapse_warnings,
    filter_metrics,
    rollout_metrics,
    template_collapse_warning,
    throughput_metrics,
    validation_metrics,
)
from ragen_core.rollout import RolloutSpec, ScriptedBackend, TrajectoryRecord, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.seeding import derive_seed, derive_seeds
from ragen_core.session import RunSession, sync_rollout_weights
from ragen_core.storage import (
    BatchMeta,
    DataLake,
    LakeError,
    checkpoint_row,
    evaluation_rows,
    event_row,
    trajectories_table,
    turns_table,
)
from ragen_core.tensorboard_sink import record_iteration
from ragen_core.training import collate
from ragen_core.training.checkpoint import prune_checkpoints, save_checkpoint
from ragen_core.training.starpo import UpdateInputs, starpo_update
from schemas.contracts import ContractReport, validate_trajectory_batch

LOGGER = logging.getLogger("ragen.monitor")


class BatchRejected(RuntimeError):
    """A batch failed its data contracts; it was quarantined and nothing from it was trained on.

    ``checks`` holds the stable names of the failed checks, ``quarantine`` the folder with the batch and report.json.
    """

    def __init__(self, message: str, checks: list[str] | None = None, quarantine: str | None = None) -> None:
        super().__init__(message)
        self.checks = checks or []
        self.quarantine = quarantine


def rollout_spec(config: RunConfig, env_name: str, group_seeds: list[int], group_size: int) -> RolloutSpec:
    """The rollout spec of ``env_name`` under the config's interaction limits."""
    return RolloutSpec(
        env_name=env_name,
        group_seeds=group_seeds,
        group_size=group_size,
        max_turns=config.env.max_turns,
        max_actions_per_turn=config.env.max_actions_per_turn,
        max_actions_per_traj=config.env.max_actions_per_traj,
        enable_think=config.rollout.enable_think,
        format_penalty=config.rollout.format_penalty,
        env_options=dict(config.env.options),
        context_window_mode=config.rollout.context_window_mode,
        max_context_window=config.rollout.max_context_window,
    )


def score_bounds(config: RunConfig, env_name: str) -> tuple[float, float]:
    """Lowest and highest trajectory score of ``env_name``: env reward bounds plus the worst format penalties."""
    low, high = make_env(env_name, **config.env.options).reward_bounds(config.env.max_actions_per_traj)
    return low + config.env.max_turns * config.rollout.format_penalty, high


def _backend(session: RunSession, temperature: float):
    rollout = session.config.rollout
    if rollout.backend == "scripted":
        return ScriptedBackend(rollout.scripted_policy, session.tokenizer)
    if rollout.backend == "vllm":
        from ragen_core.rollout.vllm_backend import VLLMBackend

        engine, tokenizer = session.rollout_engine, session.tokenizer
        return VLLMBackend(engine, tokenizer, temperature, rollout.max_new_tokens, rollout.top_p, rollout.top_k)
    return HFBackend(
        session.policy_model,
        session.tokenizer,
        temperature,
        rollout.max_new_tokens,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
    )


def generate_rollouts(session: RunSession, iteration: int) -> list[TrajectoryRecord]:
    """Stage 1: ``env_groups x group_size`` training rollouts; env seeds and sampling derive from (seed, iteration)."""
    config = session.config
    seeds = derive_seeds(config.seed, config.rollout.env_groups, iteration, "env_seeds")
    spec = rollout_spec(config, config.env.name, seeds, config.rollout.group_size)
    backend = _backend(session, config.rollout.temperature)
    records = run_rollouts(spec, backend, session.formatter, derive_seed(config.seed, iteration, "rollout"))
    maybe_fail("rollout", "inside", iteration)  # rollouts in memory, nothing written yet
    return records


def persist_trajectories(
    lake: DataLake, meta: BatchMeta, stage: str, records: list[TrajectoryRecord]
) -> dict[str, Any]:
    """Stage 2: write the batch's ``trajectories`` and ``turns`` into staging (deterministic names)."""
    lake.stage_table(meta.run_id, meta.iteration, stage, "trajectories", trajectories_table(records, meta))
    lake.stage_table(meta.run_id, meta.iteration, stage, "turns", turns_table(records, meta))
    return {"trajectories": len(records), "turns": sum(len(r.turns) for r in records)}


def validate_batch(
    lake: DataLake,
    run_id: str,
    iteration: int,
    stage: str,
    group_size: int,
    bounds: tuple[float, float],
    success_rule: Callable[[float], bool | None] | None = None,
) -> dict[str, Any]:
    """Stage 3: pandera + great-expectations on the staged batch (``schemas.contracts``); a failing or unreadable
    batch is moved to ``quarantine/`` with a machine-readable report.json and rejected, so nothing is published."""
    try:
        trajectories = lake.read_staged(run_id, iteration, stage, "trajectories")
        turns = lake.read_staged(run_id, iteration, stage, "turns")
    except LakeError as exc:
        report = ContractReport()
        report.add("storage", "staged_batch_readable", detail=str(exc))
    else:
        report = validate_trajectory_batch(trajectories, turns, group_size, bounds, success_rule=success_rule)
    if not report.ok:
        context = {"run_id": run_id, "iteration": iteration, "stage": stage, "group_size": group_size}
        where = lake.quarantine(run_id, iteration, stage, report.to_json(**context, reward_bounds=list(bounds)))
        checks = report.failed_checks()
        raise BatchRejected(
            f"batch {run_id}/{iteration}/{stage} failed checks {', '.join(checks)}; "
            f"quarantined in {where} (see report.json); nothing from it is trained on",
            checks,
            str(where),
        )
    return {"rows": trajectories.num_rows, "checks": "passed"}


def validate_env_batch(
    lake: DataLake, config: RunConfig, run_id: str, iteration: int, stage: str, env_name: str, group_size: int
) -> dict[str, Any]:
    """Stage 3 for a batch of ``env_name``: its score bounds and its reward -> success rule come from the env."""
    env = make_env(env_name, **config.env.options)
    return validate_batch(
        lake, run_id, iteration, stage, group_size, score_bounds(config, env_name), env.success_from_reward
    )


def filter_groups(lake: DataLake, run_id: str, iteration: int, spec: FilterSpec) -> dict[str, float]:
    """Stage 4: the group filter (``spec``) writes ``group_reward_std``, ``filter_metric_value`` and ``kept`` into
    the staged batch, which is then published (atomic renames). Returns filter and rollout metrics."""
    trajectories = lake.read_staged(run_id, iteration, "rollout", "trajectories")
    turns = lake.read_staged(run_id, iteration, "rollout", "turns")
    decision = apply_filter(spec, *filter_inputs(trajectories, spec.metric))
    for name, values, kind in (
        ("group_reward_std", decision.group_reward_std.numpy(), pa.float64()),
        ("filter_metric_value", decision.metric_value.numpy(), pa.float64()),
        ("kept", decision.kept.numpy(), pa.bool_()),
    ):
        index = trajectories.schema.get_field_index(name)
        trajectories = trajectories.set_column(index, trajectories.schema.field(name), pa.array(values, kind))
    lake.stage_table(run_id, iteration, "rollout", "trajectories", trajectories)
    lake.publish(run_id, iteration, "rollout")
    metrics = {**rollout_metrics(trajectories, turns), **filter_metrics(trajectories)}
    if not bool(decision.kept.any()):
        LOGGER.warning("run %s iteration %d: the filter kept no group; the update is skipped", run_id, iteration)
    lake.mark_stage_done(run_id, iteration, "rollout", {"metrics": metrics})  # a resume reuses the published batch
    maybe_fail("publish", "after", iteration)  # published, not yet trained on or committed
    return metrics


def filter_inputs(trajectories: pa.Table, metric: str) -> tuple[torch.Tensor, ...]:
    """(group index, scores, entropy, length) per trajectory for the filter; the entropy estimate (only computed for
    ``metric='entropy'``) is ``-sum(behavior_logprobs) / response_length``, the mean negative log-prob the sampler
    gave its own tokens (the log-probs are 0 off the loss mask)."""
    groups = torch.tensor(trajectories["group_id"].to_numpy(), dtype=torch.long)
    scores = torch.tensor(trajectories["total_reward"].to_numpy(), dtype=torch.float64)
    length = torch.tensor(trajectories["response_length"].to_numpy(), dtype=torch.float64)
    entropy = None
    if metric == "entropy":
        logprobs = trajectories["behavior_logprobs"]
        if logprobs.null_count:
            raise ValueError("filter metric 'entropy' needs behaviour log-probs, and scripted rows have none")
        parents = pc.list_parent_indices(logprobs).to_numpy()
        flat = pc.list_flatten(logprobs).to_numpy().astype(np.float64)
        sums = np.bincount(parents, weights=-flat, minlength=trajectories.num_rows)
        entropy = torch.tensor(sums) / length.clamp(min=1.0)
    return groups, scores, entropy, length


def kept_row_count(session: RunSession, iteration: int) -> int:
    """Published training rows of ``iteration`` the filter kept (0: the filter kept nothing, no update). An iteration
    without any published training row is an error (nothing was generated, or its commit is missing), not a skip."""
    rows = session.lake.read_table("trajectories", session.run_id, iteration, columns=["split", "kept"])
    train = pc.equal(rows["split"], "train")
    if not pc.any(train).as_py():
        raise RuntimeError(f"iteration {iteration} of {session.run_id} has no kept training rows to update on: "
                           "no training rows were published for it")  # fmt: skip
    return int(pc.sum(pc.and_(train, pc.fill_null(rows["kept"], False))).as_py() or 0)


def update_inputs(session: RunSession, iteration: int) -> UpdateInputs:
    """The published, kept training rows of ``iteration`` as update inputs (per-turn rewards when configured)."""
    rows = session.lake.read_table("trajectories", session.run_id, iteration)
    rows = rows.filter(pc.and_(pc.equal(rows["split"], "train"), pc.equal(rows["kept"], True)))
    if rows.num_rows == 0:
        raise RuntimeError(f"iteration {iteration} of {session.run_id} has no kept training rows to update on")
    rows = rows.sort_by([("group_id", "ascending"), ("traj_index", "ascending")])
    batch = collate(
        rows["input_ids"].to_pylist(),
        rows["loss_mask"].to_pylist(),
        session.tokenizer.pad_token_id,
        rows["segment_lengths"].to_pylist(),
    )
    turn_rewards = None
    if session.config.algorithm.reward_level == "turn":
        turns = session.lake.read_table("turns", session.run_id, iteration).to_pandas()
        turns = turns[turns["split"] == "train"].sort_values("turn_index")
        by_key = {
            key: list(group["reward"] + group["penalty"])
            for key, group in turns.groupby(["group_id", "traj_index"], sort=False)
        }
        keys = zip(rows["group_id"].to_pylist(), rows["traj_index"].to_pylist(), strict=True)
        turn_rewards = [by_key[key] for key in keys]
    return UpdateInputs(
        batch=batch,
        scores=torch.tensor(rows["total_reward"].to_numpy(), dtype=torch.float32),
        group_index=torch.tensor(rows["group_id"].to_numpy(), dtype=torch.long),
        turn_rewards=turn_rewards,
    )


def diagnose_reasoning(session: RunSession, iteration: int) -> dict[str, float]:
    """Stage 4b (``trainer.mi_diagnostic``): the input-reasoning mutual information of the iteration's published
    training trajectories under the policy that sampled them (before the update), as ``diag/reasoning_*`` metrics
    (:mod:`ragen_core.diagnostics`). The reasoning is the first reply's ``<think>`` block, or the whole first reply
    with thinking off; pairs are drawn from (seed, iteration). Fewer than two distinct prompts: only the counts."""
    config = session.config
    columns = ["split", "input_ids", "loss_mask"]
    rows = session.lake.read_table("trajectories", session.run_id, iteration, columns=columns)
    rows = rows.filter(pc.equal(rows["split"], "train"))
    decode = session.tokenizer.decode if config.rollout.enable_think else None
    prompts, reasonings = first_turn_reasoning(rows["input_ids"].to_pylist(), rows["loss_mask"].to_pylist(), decode)
    scorer = model_scorer(session.policy_model, session.tokenizer.pad_token_id, config.actor.micro_batch_size)
    seed = derive_seed(config.seed, iteration, "reasoning_mi")
    estimate = reasoning_mi(prompts, reasonings, scorer, config.trainer.mi_prompts, seed)
    if estimate is None:
        LOGGER.info("run %s iteration %d: fewer than two distinct prompts, no MI estimate", session.run_id, iteration)
        return {"diag/reasoning_prompts": float(len({p for p, z in zip(prompts, reasonings, strict=True) if z}))}
    return estimate.metrics()


def update_policy(session: RunSession, iteration: int) -> dict[str, float]:
    """Stage 5: the StarPO update (actor, and critic when the estimator needs one) on the iteration's kept rows.

    With ``trainer.launcher`` set, the launched group reads those rows from the lake and steps its engines; the
    rollout side then loads the new weights (as a vLLM engine does in every mode). When the filter kept no group
    (RAGEN's ``empty_after_filter``) nothing is trained: the policy stays as it is."""
    if kept_row_count(session, iteration) == 0:
        return {"actor/skipped_update": 1.0}
    if session.update_group is not None:
        metrics, weights = session.update_group.update(iteration)
        maybe_fail("update", "inside", iteration)  # the group has stepped; nothing is saved or committed
    else:
        inputs = update_inputs(session, iteration)
        metrics, weights = starpo_update(session.config, session.actor, session.critic, inputs, iteration), None
    sync_rollout_weights(session, weights)
    return metrics


def evaluate(session: RunSession, iteration: int) -> dict[str, float]:
    """Stage 6: validation rollouts on fixed instances of every validation env, stored with ``split='val'``."""
    config = session.config
    metrics: dict[str, float] = {}
    meta = BatchMeta(
        run_id=session.run_id,
        iteration=iteration,
        split="val",
        policy_version=iteration,
        temperature=config.eval.temperature,
        config_hash=session.config_hash,
    )
    for env_name in config.env.validation_envs:
        stage = f"eval-{env_name}"
        done = session.lake.stage_result(session.run_id, iteration, stage)
        if done is not None:  # published before a crash, kept by the resume: reuse it
            metrics.update(done["metrics"])
            continue
        seeds = derive_seeds(config.eval.seed, config.eval.instances, "val", env_name)
        spec = rollout_spec(config, env_name, seeds, config.eval.k)
        backend = _backend(session, config.eval.temperature)
        records = run_rollouts(spec, backend, session.formatter, derive_seed(config.seed, iteration, "eval", env_name))
        persist_trajectories(session.lake, meta, stage, records)
        validate_env_batch(session.lake, config, session.run_id, iteration, stage, env_name, config.eval.k)
        trajectories = session.lake.read_staged(session.run_id, iteration, stage, "trajectories")
        turns = session.lake.read_staged(session.run_id, iteration, stage, "turns")
        env_metrics = validation_metrics(trajectories, turns, env_name)
        session.lake.publish(session.run_id, iteration, stage)
        session.lake.mark_stage_done(session.run_id, iteration, stage, {"metrics": env_metrics})
        metrics.update(env_metrics)
    return metrics


def record_warnings(session: RunSession, iteration: int, metrics: dict[str, float]) -> list[dict[str, Any]]:
    """Echo-Trap early warnings for this iteration (against the run's earlier metrics): logged, and returned as
    ``events`` rows. The run goes on."""
    monitor = session.config.monitor
    warnings = collapse_warnings(
        session.metric_history,
        metrics,
        monitor.warmup,
        monitor.reward_std_drop,
        monitor.entropy_drop,
        monitor.grad_norm_spike,
    )
    template = template_collapse_warning(
        session.metric_history, metrics, monitor.warmup, monitor.mi_drop, monitor.mi_patience
    )
    warnings += [template] if template is not None else []
    rows = []
    for warning in warnings:
        LOGGER.warning("run %s iteration %d: %s", session.run_id, iteration, warning.message)
        rows.append(
            event_row(
                session.run_id, iteration, "early_warning", warning.message, warning.metric, warning.value,
                warning.threshold,
            )
        )  # fmt: skip
    return rows


def save_checkpoint_if_due(session: RunSession, iteration: int, metrics: dict[str, float]) -> Path | None:
    """After the update of ``iteration`` (``iteration + 1`` updates), save the engines and the Hugging Face export
    every ``trainer.checkpoint_every`` updates and after the last one; record it and prune old ones."""
    trainer, updates = session.config.trainer, iteration + 1
    if updates % trainer.checkpoint_every and updates != trainer.iterations:
        return None
    root, run_id = session.lake.root, session.run_id
    extra = {"config_hash": session.config_hash, "metrics": {k: v for k, v in metrics.items() if "/" in k}}
    if session.update_group is not None:  # the engines live in the launched group: every rank saves its shard
        path = session.update_group.save(updates, extra, lambda: maybe_fail("checkpoint", "mid_save", updates))
    else:
        path = save_checkpoint(root, run_id, updates, session.actor, session.critic, session.tokenizer, extra)
    rows = [
        checkpoint_row(run_id, iteration, str(path), "deepspeed", extra["metrics"]),
        checkpoint_row(run_id, iteration, str(path / "hf"), "hf", extra["metrics"]),
    ]
    session.lake.write_rows("checkpoints", run_id, iteration, rows, stage="commit", publish=False)
    prune_checkpoints(root, run_id, trainer.keep_last)
    return path


def commit_iteration(
    session: RunSession, iteration: int, metrics: dict[str, float], updated: bool = False
) -> dict[str, Any]:
    """Stage 7: the checkpoint when due (``updated``: the iteration ran an update), the metrics rows (plus
    throughput), the early-warning events and the evaluations rows (from the published ``split='val'`` rows, when
    the iteration has any); publish them, write the commit marker and update the manifest."""
    lake, run_id = session.lake, session.run_id
    metrics = {**metrics, **throughput_metrics(metrics)}
    checkpoint = save_checkpoint_if_due(session, iteration, metrics) if updated else None
    names = sorted(metrics)
    rows = [{"run_id": run_id, "iteration": iteration, "name": n, "value": float(metrics[n])} for n in names]
    lake.write_rows("metrics", run_id, iteration, rows, stage="commit", publish=False)
    events = record_warnings(session, iteration, metrics)
    if metrics.get("actor/skipped_update"):  # RAGEN's empty_after_filter: recorded so SQL can find such iterations
        message = "the filter kept no group, so this iteration trained nothing"
        events.append(event_row(run_id, iteration, "empty_after_filter", message, "filter/kept_groups", 0.0))
    if events:
        lake.write_rows("events", run_id, iteration, events, stage="commit", publish=False)
    columns = ["run_id", "iteration", "split", "env", "group_id", "success", "total_reward", "response_length"]
    published = lake.read_table("trajectories", run_id, iteration, columns=columns + ["temperature"])
    evaluations = evaluation_rows(published)
    if evaluations.num_rows:
        lake.write_rows("evaluations", run_id, iteration, evaluations, stage="commit", publish=False)
    lake.publish(run_id, iteration, "commit")
    summary = {"metrics": len(names), "evaluations": evaluations.num_rows, "events": len(events)}
    if checkpoint is not None:
        summary["checkpoint"] = str(checkpoint)
    lake.commit_iteration(run_id, iteration, summary)
    if session.config.monitor.tensorboard:  # a view of the committed rows, so written after the marker
        record_iteration(lake, run_id, iteration, {row["name"]: row["value"] for row in rows})
    session.metric_history.append(metrics)
    session.update_manifest(last_committed_iteration=iteration)
    return {"iteration": iteration, **summary}
