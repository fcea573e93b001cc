"""The ``train`` flow and its ``starpo_iteration`` subflow."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow

from ragen_core.config import RunConfig, build_config
from ragen_core.session import RunSession, base_model_dir, check_run_id_free, default_run_id
from ragen_core.stages import score_bounds
from ragen_core.storage import BatchMeta, DataLake
from tasks import stages as t

ProgressCallback = Callable[[int, dict[str, float]], None]


def _timed(metrics: dict[str, float], name: str, result: Any, started: float) -> Any:
    metrics[f"time/{name}"] = time.perf_counter() - started
    return result


def eval_due(config: RunConfig, iteration: int) -> bool:
    """Validation runs at iteration 0, every ``eval.every`` iterations, and after the last update."""
    return iteration % config.eval.every == 0 or iteration == config.trainer.iterations


@flow(name="starpo_iteration", validate_parameters=False)
def starpo_iteration(session: RunSession, iteration: int) -> dict[str, float]:
    """One StarPO iteration: [evaluate] -> generate -> persist -> validate -> filter -> update -> commit."""
    config, lake, run_id = session.config, session.lake, session.run_id
    metrics: dict[str, float] = {}
    start = time.perf_counter()
    if eval_due(config, iteration):
        metrics.update(_timed(metrics, "evaluate", t.evaluate(session, iteration), start))
    start = time.perf_counter()
    records = _timed(metrics, "generate", t.generate_rollouts(session, iteration), start)
    meta = BatchMeta(run_id, iteration, "train", iteration, config.rollout.temperature, session.config_hash)
    start = time.perf_counter()
    _timed(metrics, "persist", t.persist_trajectories(lake, meta, "rollout", records), start)
    start = time.perf_counter()
    bounds = score_bounds(config, config.env.name)
    _timed(
        metrics,
        "validate",
        t.validate_batch(lake, run_id, iteration, "rollout", config.rollout.group_size, bounds),
        start,
    )
    start = time.perf_counter()
    filter_stats = t.filter_groups(lake, run_id, iteration, config.algorithm.filter, config.algorithm.filter_ratio)
    metrics.update(_timed(metrics, "filter", filter_stats, start))
    start = time.perf_counter()
    metrics.update(_timed(metrics, "update", t.update_policy(session, iteration), start))
    t.commit_iteration(session, iteration, metrics)
    return metrics


@flow(name="final_evaluation", validate_parameters=False)
def final_evaluation(session: RunSession, iteration: int) -> dict[str, float]:
    """Validation of the final policy, committed as its own iteration (``iteration`` = number of updates)."""
    metrics = t.evaluate(session, iteration)
    t.commit_iteration(session, iteration, metrics)
    return metrics


@flow(name="train", validate_parameters=False)
def train(
    config: dict[str, Any],
    data_root: str = "data",
    run_id: str | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Train one run: [bootstrap] -> open session -> ``trainer.iterations`` x starpo_iteration -> final validation."""
    run_config = build_config(config)
    lake = DataLake(data_root)
    run_id = run_id or default_run_id(run_config)
    check_run_id_free(lake, run_id)
    start_dir = base_model_dir(run_config, lake)
    bootstrap_summary = None
    if run_config.bootstrap.enabled:
        start_dir, bootstrap_summary = t.bootstrap(run_config, lake, start_dir)
    session = t.start_session(run_config, lake, run_id, start_dir)
    session.update_manifest(bootstrap=bootstrap_summary)
    history: dict[int, dict[str, float]] = {}
    try:
        for iteration in range(run_config.trainer.iterations):
            history[iteration] = starpo_iteration(session, iteration)
            if progress:
                progress(iteration, history[iteration])
        final = run_config.trainer.iterations
        history[final] = final_evaluation(session, final)
        if progress:
            progress(final, history[final])
    except BaseException as exc:
        session.update_manifest(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    session.update_manifest(status="completed")
    return {
        "run_id": run_id,
        "data_root": str(Path(data_root).resolve()),
        "bootstrap": bootstrap_summary,
        "iterations": run_config.trainer.iterations,
    }
