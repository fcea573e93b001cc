"""The stages of one StarPO iteration, functions over ``(session, iteration, state)``, and their tables (Prefect-free).

[evaluate] -> generate -> [the batch pipeline: persist -> validate -> filter + publish] -> [diagnose] -> update ->
commit (:data:`ITERATION`, at the end of this module, walked by :func:`ragen_core.run.iteration.run_iteration`);
validation rollouts (evaluate) run at iterations 0, every ``eval.every`` and after the last update
(:data:`FINAL_VALIDATION`), so ``split='val'`` rows of iteration i measure the policy after i updates. ``diagnose``
(``trainer.mi_diagnostic``) scores the input-reasoning mutual information of the batch with the policy that sampled
it. Each stage puts what the later ones need into the :class:`~ragen_core.run.iteration.IterationState` and returns
what it made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from ragen_core.algos.filters import ENTROPY_METRICS
from ragen_core.config import RunConfig
from ragen_core.envs import registered_envs
from ragen_core.envs.external import metric_env_name
from ragen_core.envs.held_out import Split, validation_seeds
from ragen_core.faults import maybe_fail
from ragen_core.monitor.diagnostics import (
    Scorer,
    TokenIds,
    every_turn_reasoning,
    first_turn_reasoning,
    model_scorer,
    reasoning_mi,
    sampled_turns,
)
from ragen_core.monitor.metrics import (
    MI_KEYS,
    collapse_warnings,
    filter_metrics,
    rollout_metrics,
    template_collapse_warnings,
    throughput_metrics,
    tool_failure_events,
    truncation_warnings,
    unreached_warnings,
    validation_metrics,
)
from ragen_core.rollout import RolloutSpec, TrajectoryRecord, run_rollouts
from ragen_core.rollout.records import BatchMeta
from ragen_core.rollout.sampling import check_version
from ragen_core.run.batches import BatchPipeline, BatchRules, TrajectoryEntropy
from ragen_core.run.decisions import stops_early
from ragen_core.run.iteration import IterationState, Step
from ragen_core.run.schedule import Lane, SyncOnly, sampling_version
from ragen_core.seeding import derive_seed, derive_seeds
from ragen_core.storage import Stage, checkpoint_row, evaluation_rows, event_row
from ragen_core.storage.layout import CHECKPOINT_ADAPTER, CHECKPOINT_HF, checkpoint_file
from ragen_core.training.entropy import trajectory_entropy
from ragen_core.training.rows import TokenRows
from ragen_core.training.turn_rows import turn_entropy
from ragen_core.training.updater import SKIPPED

if TYPE_CHECKING:  # the session holds its schedule, which runs these rows
    from ragen_core.run.session import RunSession

LOGGER = logging.getLogger("ragen.monitor")


def rollout_spec(
    config: RunConfig, env_name: str, group_seeds: list[int], group_size: int, split: Split
) -> RolloutSpec:
    """The rollout spec of ``env_name`` under the config's interaction limits; ``split`` says whose maps its seeds
    draw when the config holds out maps (``eval.held_out``: training and the bootstrap ``train``, validation
    ``val``)."""
    return RolloutSpec(
        env_name=env_name,
        group_seeds=group_seeds,
        group_size=group_size,
        max_turns=config.env.max_turns,
        max_actions_per_turn=config.env.max_actions_per_turn,
        max_actions_per_traj=config.env.max_actions_per_traj,
        enable_think=config.rollout.enable_think,
        format_penalty=config.rollout.format_penalty,
        reply_format=config.rollout.reply_format,
        env_options=dict(config.env.options),
        context_window_mode=config.rollout.context_window_mode,
        max_context_window=config.rollout.max_context_window,
        split=split if config.eval.held_out == "maps" else None,
        user_code_timeout_s=config.env.user_code_timeout_s,
        tool_timeout_s=config.env.tool_timeout_s,
        tool_parser=config.rollout.tool_parser,
        env_remote=config.env.remote_for(env_name),
        env_mcp=config.env.mcp,
    )


def generate_rollouts(session: RunSession, iteration: int, state: IterationState) -> list[TrajectoryRecord]:
    """Stage 1: ``env_groups x group_size`` training rollouts; env seeds and sampling derive from (seed, iteration)."""
    config = session.config
    seeds = derive_seeds(config.seed, config.rollout.env_groups, iteration, "env_seeds")
    spec = rollout_spec(config, config.env.name, seeds, config.rollout.group_size, "train")
    backend = session.policy.training_backend(config.rollout)
    version, what = session.schedule.sampling_version(iteration), f"iteration {iteration}'s training batch"
    check_version(backend, version, what)  # the weights the schedule names, before any compute
    records = run_rollouts(spec, backend, session.policy.formatter, derive_seed(config.seed, iteration, "rollout"))
    check_version(backend, version, what)  # and no hand-off came in the middle of the batch
    maybe_fail("rollout", "inside", iteration)  # rollouts in memory, nothing written yet
    state.records = records
    return records


def training_batch(session: RunSession, iteration: int) -> BatchPipeline:
    """The batch pipeline of ``iteration``'s training rollouts."""
    config, staleness = session.config, session.schedule.staleness
    version = sampling_version(iteration, staleness)
    meta = BatchMeta.training(session.run_id, iteration, config.rollout.temperature, session.config_hash, version)
    rules = BatchRules.of(config, config.env.name, config.rollout.group_size, staleness)
    return BatchPipeline(session.lake, meta, Stage.ROLLOUT, rules)


def persist(session: RunSession, iteration: int, state: IterationState) -> dict[str, Any]:
    """Stage 2: the training rollouts as the lake's tables, the turns staged as Parquet (invisible to readers until
    the filter publishes them); the trajectories are written once, with the filter's columns, when published."""
    state.batch = training_batch(session, iteration)
    return state.batch.persist(state.records)


def validate(session: RunSession, iteration: int, state: IterationState) -> dict[str, Any]:
    """Stage 3: the data contracts on the staged batch; a failing batch is quarantined (:class:`BatchRejected`)."""
    return _batch(state).validate()


def filter_and_publish(session: RunSession, iteration: int, state: IterationState) -> dict[str, float]:
    """Stage 4: the group filter the session's config sets (``algorithm.filter`` and its options, the entropy of
    :func:`filter_entropy`) marks the kept groups; the trajectories are then written (once) and the batch published
    and marked done; returns the rollout and filter metrics."""
    batch = _batch(state)
    batch.filter(session.config.algorithm, filter_entropy(session))
    metrics = batch.publish(
        lambda trajectories, turns: {**rollout_metrics(trajectories, turns), **filter_metrics(trajectories)}
    )
    maybe_fail("publish", "after", iteration)  # published, not yet trained on or committed
    state.metrics.update(metrics)
    return metrics


def _batch(state: IterationState) -> BatchPipeline:
    if state.batch is None:
        raise RuntimeError("the iteration has no training batch: the persist stage makes it")
    return state.batch


def filter_entropy(session: RunSession) -> TrajectoryEntropy | None:
    """The filter's per-trajectory entropy when ``algorithm.filter_entropy`` is ``full`` (an entropy metric): the
    full-distribution token entropy under the policy that sampled the batch, at the sampling temperature; None: the
    filter uses the stored log-probs' estimate (or needs no entropy). With ``rollout.training_rows=turn`` (either
    entropy) a trajectory's entropy is the mean over its turn rows of each row's, as RAGEN-2's turn-level modes."""
    config = session.config
    turn_rows = config.rollout.training_rows == "turn"
    if config.algorithm.filter_metric not in ENTROPY_METRICS:
        return None
    if config.algorithm.filter_entropy != "full":
        return turn_entropy if turn_rows else None

    def entropy(trajectories: pa.Table) -> torch.Tensor:
        score = partial(
            trajectory_entropy,
            session.policy.model,
            pad_id=session.tokenizer.pad_token_id,
            temperature=config.rollout.temperature,
            batch_size=config.actor.micro_batch_size,
        )
        if turn_rows:
            return turn_entropy(trajectories, lambda turns: score(turns.tokens))
        return score(TokenRows.from_table(trajectories))

    return entropy


def diagnose_reasoning(session: RunSession, iteration: int, state: IterationState) -> dict[str, float]:
    """Stage 4b (``trainer.mi_diagnostic``): the input-reasoning mutual information of the iteration's published
    training trajectories under the policy that sampled them (before the update), as ``diag/reasoning_*`` metrics
    (:mod:`ragen_core.monitor.diagnostics`), and with ``trainer.mi_multi_turn`` RAGEN-2's multi-turn sample as
    ``diag/reasoning_mt_*``. The reasoning follows ``trainer.mi_reasoning``; candidates and draws come from (seed,
    iteration). Fewer than two distinct prompts: only the prompt count."""
    config, trainer = session.config, session.config.trainer
    columns = ["split", "input_ids", "loss_mask"]
    rows = session.lake.read_table("trajectories", session.run_id, iteration, columns=columns)
    rows = rows.filter(pc.equal(rows["split"], "train"))
    tokens = TokenRows.from_table(rows)
    ids, masks = tokens.id_rows(), tokens.mask_rows()
    decode = session.tokenizer.decode if config.rollout.enable_think else None
    encode = partial(session.tokenizer.encode, add_special_tokens=False)  # RAGEN-2 re-tokenises the think content
    span = (trainer.mi_reasoning, config.rollout.think_prefix, encode)
    scorer = model_scorer(session.policy.model, session.tokenizer.pad_token_id, config.actor.micro_batch_size)
    prompts, reasonings = first_turn_reasoning(ids, masks, decode, *span)
    metrics = _mi_metrics(
        prompts,
        reasonings,
        scorer,
        trainer.mi_prompts,
        derive_seed(config.seed, iteration, "reasoning_mi"),
        "reasoning",
        None,
    )
    if trainer.mi_multi_turn:
        turns = every_turn_reasoning(ids, masks, decode, *span)
        pairs = sampled_turns(turns, trainer.mi_samples, derive_seed(config.seed, iteration, "reasoning_mt_draws"))
        seed = derive_seed(config.seed, iteration, "reasoning_mt")
        metrics.update(
            _mi_metrics(
                [x for x, _ in pairs],
                [z for _, z in pairs],
                scorer,
                trainer.mi_prompts,
                seed,
                "reasoning_mt",
                range(len(pairs)),
            )
        )
    state.metrics.update(metrics)
    return metrics


def _mi_metrics(
    prompts: Sequence[TokenIds],
    reasonings: Sequence[TokenIds],
    scorer: Scorer,
    max_prompts: int,
    seed: int,
    stem: str,
    columns: Sequence[int] | None,
) -> dict[str, float]:
    """The ``diag/<stem>_*`` metrics of one estimate, or only the prompt count when there is none."""
    estimate = reasoning_mi(prompts, reasonings, scorer, max_prompts, seed, columns)
    if estimate is not None:
        return estimate.metrics(stem=stem)
    keys = columns if columns is not None else prompts
    LOGGER.info("%s: fewer than two distinct prompts with a reasoning, no MI estimate", stem)
    return {f"diag/{stem}_prompts": float(len({k for k, z in zip(keys, reasonings, strict=True) if z}))}


def update_policy(session: RunSession, iteration: int, state: IterationState) -> dict[str, float]:
    """Stage 5: the StarPO update (actor, and critic when the estimator needs one) on the iteration's kept rows, by
    the session's updater; the rollout side then samples from the new weights. When the filter kept no group
    (RAGEN's ``empty_after_filter``) nothing is trained: the policy stays as it is (the iteration still counts as
    updated: its commit saves a checkpoint when one is due). When the new weights reach the rollout side is the
    schedule's: here (synchronous), or at the hand-off before the commit (:mod:`ragen_core.run.overlap`), while the
    sampler still samples with the old ones."""
    metrics = session.updater.update(iteration)
    if session.schedule.syncs_after_update:
        if metrics == SKIPPED:  # the weights stay; the samplers hold them as the next policy version
            session.policy.relabel(session.updater.version)
        else:
            session.updater.sync(session.policy)
    state.metrics.update(metrics)
    state.updated = True
    return metrics


def evaluate(session: RunSession, iteration: int, state: IterationState) -> dict[str, float]:
    """Stage 0 (when due): validation rollouts on fixed instances of every validation env, stored with
    ``split='val'``; an env whose batch a crash left published is reused. ``state.tell`` hears of each env as it
    starts and ends (the commands that are a validation and little else say so: ``ragen eval``, ``ragen retrain``)."""
    config, step = session.config, state.tell
    metrics: dict[str, float] = {}
    meta = BatchMeta.validation(session.run_id, iteration, config.eval.temperature, session.config_hash)
    for env_name in config.env.validation_envs:
        stage = Stage.evaluation(env_name)
        done = session.lake.stage_result(session.run_id, iteration, stage)
        if done is None:
            started = time.monotonic()
            samples = f" x {config.eval.k} samples" if config.eval.k > 1 else ""
            _tell(step, f"validating on {env_name}: {config.eval.instances} instances{samples}")
            spec = rollout_spec(config, env_name, validation_seeds(config, env_name), config.eval.k, "val")
            backend = session.policy.backend(config.rollout, config.eval.temperature)
            sampling = derive_seed(config.seed, iteration, "eval", env_name)
            records = run_rollouts(spec, backend, session.policy.formatter, sampling)
            pipeline = BatchPipeline(session.lake, meta, stage, BatchRules.of(config, env_name, config.eval.k))
            key = metric_env_name(env_name)  # an import path's class name: short metric keys
            done = {"metrics": pipeline.run(records, partial(validation_metrics, env=key))}
            success = done["metrics"][f"val/{key}/success"]
            _tell(step, f"{env_name}: success {success:.3f} ({time.monotonic() - started:.0f} s)")
        else:
            _tell(step, f"{env_name}: its stored validation reused")
        metrics.update(done["metrics"])
    state.metrics.update(metrics)
    return metrics


def _tell(step: Callable[[str], None] | None, text: str) -> None:
    if step is not None:
        step(text)


def record_warnings(session: RunSession, iteration: int, metrics: dict[str, float]) -> list[dict[str, Any]]:
    """Echo-Trap early warnings for this iteration (against the run's earlier metrics), replies that stop ending
    (``monitor.truncated_share``), and no reply reaching the user's own reward or env (:func:`users_code`): logged,
    and returned as ``events`` rows. The run goes on."""
    monitor, history = session.config.monitor, session.record.metric_history
    warnings = collapse_warnings(
        history,
        metrics,
        monitor.warmup,
        monitor.reward_std_drop,
        monitor.entropy_drop,
        monitor.grad_norm_spike,
        monitor.converged_success,
        monitor.success_slip,
    )
    warnings += template_collapse_warnings(
        history, metrics, monitor.warmup, monitor.mi_drop, monitor.mi_patience, MI_KEYS[monitor.mi_metric]
    )
    if monitor.truncated_share is not None:
        limit = session.config.rollout.max_new_tokens
        warnings += truncation_warnings(history, metrics, monitor.truncated_share, limit)
    code = users_code(session.config)
    if code is not None:
        warnings += unreached_warnings(history, metrics, code)
    rows = []
    for warning in warnings:
        LOGGER.warning("run %s iteration %d: %s", session.run_id, iteration, warning.message)
        rows.append(
            event_row(
                session.run_id,
                iteration,
                "early_warning",
                warning.message,
                warning.metric,
                warning.value,
                warning.threshold,
            )
        )
    return rows


def users_code(config: RunConfig) -> str | None:
    """What of the user's own code the training env runs on a valid answer: the dataset env's reward function, or
    the step of an environment that is not this project's; None for this project's environments."""
    name = config.env.name
    if name == "dataset":
        return f"the reward function {config.env.options.get('reward_fn')}"
    return None if name in registered_envs() else f"the step of environment {name}"


def stop_early(session: RunSession, iteration: int) -> bool:
    """Before training ``iteration``: whether the run stops here (``algorithm.filter_empty_stop_steps`` consecutive
    committed iterations kept no group, :func:`ragen_core.run.decisions.stops_early`); the stop is logged and
    recorded in the manifest (``early_stop``), and the run's final validation is then committed as ``iteration``."""
    steps = session.config.algorithm.filter_empty_stop_steps
    if not stops_early(session.record.metric_history, steps):
        return False
    LOGGER.warning(
        "run %s: the filter kept no group for %d consecutive iterations; training stops before iteration %d "
        "(algorithm.filter_empty_stop_steps=%d)",
        session.run_id,
        steps,
        iteration,
        steps,
    )
    session.record.update(early_stop={"iteration": iteration, "reason": "filter_empty_stop_steps", "steps": steps})
    return True


def save_checkpoint_if_due(session: RunSession, iteration: int, metrics: dict[str, float]) -> Path | None:
    """After the update of ``iteration`` (``iteration + 1`` updates), save the engines and the Hugging Face export
    every ``trainer.checkpoint_every`` updates and after the last one (the last before an early stop included);
    record it and prune old ones."""
    trainer, updates = session.config.trainer, iteration + 1
    last = updates == trainer.iterations or stops_early(
        [*session.record.metric_history, metrics], session.config.algorithm.filter_empty_stop_steps
    )
    if updates % trainer.checkpoint_every and not last:
        return None
    run_id = session.run_id
    extra = {"config_hash": session.config_hash, "metrics": {k: v for k, v in metrics.items() if "/" in k}}
    path = session.updater.save(updates, extra)
    policy, kind = (CHECKPOINT_ADAPTER, "lora") if session.config.actor.lora is not None else (CHECKPOINT_HF, "hf")
    rows = [
        checkpoint_row(run_id, iteration, str(path), "deepspeed", extra["metrics"]),
        checkpoint_row(run_id, iteration, str(checkpoint_file(path, policy)), kind, extra["metrics"]),
    ]
    session.lake.write_rows("checkpoints", run_id, iteration, rows, stage=Stage.COMMIT, publish=False)
    session.lake.prune_checkpoints(run_id, trainer.keep_last)
    return path


def step_time(session: RunSession) -> dict[str, float]:
    """``time/step``: the wall seconds from this process's previous commit to this one, what an iteration costs when
    its stages overlap (an asynchronous run: the sum of its ``time/<stage>`` counts the overlap twice); none at a
    process's first commit (a resumed run starts a new count)."""
    now, last = time.perf_counter(), session.last_commit
    session.last_commit = now
    return {} if last is None else {"time/step": now - last}


def commit_iteration(session: RunSession, iteration: int, state: IterationState) -> dict[str, Any]:
    """Stage 7: the checkpoint when due (``state.updated``: the iteration ran an update), the metrics rows of
    ``state.metrics`` (plus throughput), the early-warning events and the evaluations rows (from the published
    ``split='val'`` rows, when the iteration has any); publish them, write the commit marker and update the
    manifest; returns the commit's summary."""
    lake, run_id, updated = session.lake, session.run_id, state.updated
    metrics = {**state.metrics, **throughput_metrics(state.metrics), **step_time(session)}
    checkpoint = save_checkpoint_if_due(session, iteration, metrics) if updated else None
    names = sorted(metrics)
    rows = [{"run_id": run_id, "iteration": iteration, "name": n, "value": float(metrics[n])} for n in names]
    lake.write_rows("metrics", run_id, iteration, rows, stage=Stage.COMMIT, publish=False)
    events = record_warnings(session, iteration, metrics)
    events += [
        event_row(run_id, iteration, "tool_error", message, metric, value)
        for metric, value, message in tool_failure_events(metrics)
    ]
    if metrics.get("actor/skipped_update"):  # RAGEN's empty_after_filter: recorded so SQL can find such iterations
        message = "the filter kept no group, so this iteration trained nothing"
        events.append(event_row(run_id, iteration, "empty_after_filter", message, "filter/kept_groups", 0.0))
    if events:
        lake.write_rows("events", run_id, iteration, events, stage=Stage.COMMIT, publish=False)
    columns = ["run_id", "iteration", "split", "env", "group_id", "success", "total_reward", "response_length"]
    published = lake.read_table("trajectories", run_id, iteration, columns=columns + ["temperature"])
    evaluations = evaluation_rows(published)
    if evaluations.num_rows:
        lake.write_rows("evaluations", run_id, iteration, evaluations, stage=Stage.COMMIT, publish=False)
    lake.publish(run_id, iteration, Stage.COMMIT)
    # ``updated`` tells a later resume which commit is a run's final validation (ragen_core.run.decisions)
    summary = {"metrics": len(names), "evaluations": evaluations.num_rows, "events": len(events), "updated": updated}
    if checkpoint is not None:
        summary["checkpoint"] = str(checkpoint)
    lake.commit_iteration(run_id, iteration, summary)
    # the trackers (TensorBoard, MLflow, W&B) are views of the committed rows, so they get them after the marker
    session.trackers.log(iteration, {row["name"]: row["value"] for row in rows})
    session.record.metric_history.append(metrics)
    session.record.update(last_committed_iteration=iteration)
    return {"iteration": iteration, **summary}


def evaluation_due(session: RunSession, iteration: int, state: IterationState) -> bool:
    """Validation runs at iteration 0, every ``eval.every`` iterations and after the last update; and whenever a
    validation of ``iteration`` already finished (an extended run's reopened final validation: its metrics then
    belong to the iteration's)."""
    config = session.config
    if iteration % config.eval.every == 0 or iteration == config.trainer.iterations:
        return True
    finished = session.lake.finished_stages(session.run_id, iteration)
    return any(stage.startswith(Stage.evaluation("")) for stage in finished)


def diagnostic_on(session: RunSession, iteration: int, state: IterationState) -> bool:
    """``trainer.mi_diagnostic``: the reasoning MI diagnostic runs in every iteration."""
    return session.config.trainer.mi_diagnostic


EVALUATION = Step("evaluate", evaluate, lane=Lane.LEARNER)
COMMIT = Step("commit", commit_iteration, lane=Lane.COMMIT)
# the MI diagnostic scores the batch with the policy that sampled it: an async run's learner no longer holds it
SAMPLING_POLICY = SyncOnly(
    "trainer.mi_diagnostic",
    "scores each batch with the policy that sampled it, which an async run keeps only in its sampler",
)

# One StarPO iteration, in run order: a row's stage names its clock key, its task run and the manifest's position;
# its lane, where an async run runs it (ragen_core.run.schedule: the lanes are derived from this table).
ITERATION: tuple[Step, ...] = (
    Step("evaluate", evaluate, when=evaluation_due, lane=Lane.LEARNER),  # of the policy after `iteration` updates
    Step("generate", generate_rollouts, lane=Lane.SAMPLER),
    Step("persist", persist, lane=Lane.SAMPLER),
    Step("validate", validate, lane=Lane.SAMPLER),
    Step("filter", filter_and_publish, lane=Lane.SAMPLER),
    # by the policy that sampled the batch, so before the update (synchronous runs only: SAMPLING_POLICY)
    Step("diagnose", diagnose_reasoning, when=diagnostic_on, lane=Lane.SAMPLER, sync_only=SAMPLING_POLICY),
    Step("update", update_policy, lane=Lane.LEARNER),
    COMMIT,
)
# The validation of the final policy, committed as its own iteration (iteration = number of updates).
FINAL_VALIDATION: tuple[Step, ...] = (EVALUATION, COMMIT)
