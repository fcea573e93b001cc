"""Orchestration overhead, Parquet share and memory, measured inside a real ``train`` flow run.

The flow runs as users run it (Prefect's temporary local server; each iteration a group of tasks of the ``train``
flow). A measurement harness in this process wraps, without changing what they do:

- the core call of every stage (the :mod:`ragen_core.run.stages` functions the rows of its tables name, which the
  tasks call), so core time per iteration is known;
- each training iteration's ``run_iteration`` call (:mod:`ragen_core.run.procedures`), so its wall time is known;
- ``atomic_write_parquet`` (Parquet encode + fsync + rename), for the storage share;
- resident memory, sampled every 10 ms, with the peak taken per iteration.

Overhead of an iteration = (wall time - time inside core calls) / wall time: Prefect's task runs, the
flow's own glue and anything else that is neither generating, storing, validating nor learning.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, RssSampler, patched, spread

# the tables of flows/train.py whose steps' functions are the stages' core calls (ragen_core.run.stages)
TABLES = ("ITERATION", "FINAL_VALIDATION")


class CoreClock:
    """Seconds inside the outermost core calls, per call name, since the last ``take``."""

    def __init__(self) -> None:
        self.depth = 0
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)  # a step's task is named as its function
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
                self.depth -= 1

        return timed

    def take(self) -> dict[str, float]:
        seconds, self.seconds = self.seconds, {}
        return seconds


@dataclass(frozen=True)
class FlowCase:
    """One train flow run: a label, config overrides on configs/bandit.yaml, and the data root."""

    label: str
    overrides: tuple[str, ...]
    data_root: Path


def run_flow(
    case: FlowCase, sample_memory: bool = False, progress: Any = None, variant: bool = False
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Run the train flow of ``case``; one row per iteration (wall, core per stage, task-measured stage times,
    Parquet write seconds, validation metrics and, with ``sample_memory``, peak resident bytes) and the final
    validation's metrics. ``progress(iteration, metrics)`` hears the flow's progress (:func:`flows.ui.watching`).

    ``variant`` measures the previous design side by side: the iteration as a ``starpo_iteration`` subflow of its
    own, and the steps' state (the rollout records) handed to the tasks as it is (Prefect walks it looking for
    futures). The flow itself runs each iteration as a group of tasks of ``train`` with the state ``quote``-d.
    """
    import flows.train as train_module
    import ragen_core.run.overlap as overlap_module
    import ragen_core.run.procedures as procedure_module
    import ragen_core.run.stages as stages_module
    import ragen_core.storage.lake as lake_module
    import tasks.iteration as task_module
    from flows.ui import watching
    from ragen_core.run.checks import load_run_config as load_config

    config = load_config(ROOT / "configs" / "bandit.yaml", list(case.overrides))
    clock, parquet = CoreClock(), CoreClock()
    rows: list[dict[str, Any]] = []
    sampler = RssSampler()
    original_iteration = procedure_module.run_iteration
    tables = {table: timed_steps(clock, getattr(stages_module, table)) for table in TABLES}
    previous_design = None
    if variant:
        from prefect import flow

        previous_design = flow(name="starpo_iteration", validate_parameters=False)(original_iteration)

    def timed_iteration(session: Any, iteration: int, steps: Any, *rest: Any, **options: Any) -> dict[str, float]:
        if steps is not tables["ITERATION"]:  # the final validation: untimed, as before
            return original_iteration(session, iteration, steps, *rest, **options)
        clock.take(), parquet.take()
        if sample_memory:
            sampler.window()
        started = time.perf_counter()
        metrics = (previous_design if variant else original_iteration)(session, iteration, steps, *rest, **options)
        wall = time.perf_counter() - started
        core_seconds = clock.take()
        row = {
            "iteration": iteration,
            "wall_s": wall,
            "core_s": sum(core_seconds.values()),
            "core": core_seconds,
            "stage_s": {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("time/") and "_" not in k},
            "parquet_write_s": parquet.take().get("parquet", 0.0),
            "evaluated": "time/evaluate" in metrics,
            "trained_tokens": metrics.get("actor/trained_tokens", 0.0),
            "metrics": {k: v for k, v in metrics.items() if k.startswith("val/")},
        }
        if sample_memory:
            row["peak_rss_bytes"] = sampler.window()
        rows.append(row)
        return metrics

    original_iterations = procedure_module.run_iterations

    def timed_iterations(session: Any, first: int, *rest: Any) -> int:  # the iterations of the timed table
        return original_iterations(session, first, *rest, table=tables["ITERATION"])

    patches = [
        patched(procedure_module, "FINAL_VALIDATION", tables["FINAL_VALIDATION"]),
        patched(procedure_module, "run_iterations", timed_iterations),
        patched(overlap_module, "run_iteration", timed_iteration),
    ]
    patches.append(
        patched(lake_module, "atomic_write_parquet", parquet.wrap("parquet", lake_module.atomic_write_parquet))
    )
    patches.append(patched(procedure_module, "run_iteration", timed_iteration))
    if variant:  # the records unquoted, as before
        patches.append(patched(task_module, "quote", lambda value: value))
    final: dict[str, float] = {}

    def on_progress(iteration: int, metrics: dict[str, float]) -> None:
        if iteration == config.trainer.iterations:
            final.update(metrics)
        if progress is not None:
            progress(iteration, metrics)

    for patch in patches:
        patch.__enter__()
    try:
        with sampler if sample_memory else _Null():
            with watching(on_progress):
                train_module.train(
                    config=config.to_dict(), data_root=str(case.data_root), run_id=f"bench-{case.label}"
                )
    finally:
        for patch in reversed(patches):
            patch.__exit__(None, None, None)
    return rows, final


def timed_steps(clock: CoreClock, steps: tuple[Any, ...]) -> tuple[Any, ...]:
    """The table ``steps`` with each step's function timed by ``clock`` under the function's name."""
    return tuple(replace(step, function=clock.wrap(step.function.__name__, step.function)) for step in steps)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def overhead_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Overhead share per iteration (median and spread over the iterations without validation, and over all), where
    it goes (subflow vs task wrappers), and the Parquet write and data-contract (``validation_share``) shares."""
    plain = [r for r in rows if not r["evaluated"]] or rows
    shares = [(r["wall_s"] - r["core_s"]) / r["wall_s"] for r in plain]
    wall = sum(r["wall_s"] for r in rows)
    core = sum(r["core_s"] for r in rows)
    task_wrapped = sum(sum(r["stage_s"].values()) for r in plain)
    subflow = [r["wall_s"] - sum(r["stage_s"].values()) for r in plain]  # outside every stage's task call
    tasks = [sum(r["stage_s"].values()) - r["core_s"] for r in plain]  # inside task calls, outside the core
    stage_core: dict[str, list[float]] = {}
    for r in plain:
        for name, seconds in r["core"].items():
            stage_core.setdefault(name, []).append(seconds)
    return {
        "iterations": len(rows),
        "overhead_share": spread(shares),
        "overhead_share_all_iterations": (wall - core) / wall,
        "iteration_wall_s": spread([r["wall_s"] for r in plain]),
        "core_s": spread([r["core_s"] for r in plain]),
        "subflow_and_glue_s": spread(subflow),
        "task_wrappers_s": spread(tasks),
        "task_wrapped_share": task_wrapped / sum(r["wall_s"] for r in plain),
        "core_by_stage_s": {name: spread(values) for name, values in stage_core.items()},
        "parquet_write_share": spread([r["parquet_write_s"] / r["wall_s"] for r in plain]),
        # the validate stage's core call (read the staged batch + data contracts) over the iteration's wall time
        "validation_share": spread([r["core"].get("validate", 0.0) / r["wall_s"] for r in plain]),
        "parquet_write_s": spread([r["parquet_write_s"] for r in plain]),
    }


def memory_summary(rows: list[dict[str, Any]], early: int = 5) -> dict[str, Any]:
    """Peak resident memory per iteration and ``peak_rss_growth`` = (peak at the last iteration - peak at iteration
    ``early``) / peak at iteration ``early`` (1-based iterations)."""
    peaks = [r["peak_rss_bytes"] for r in rows]
    early = min(early, len(peaks))
    first, last = peaks[early - 1], peaks[-1]
    return {
        "peak_rss_mib": [round(p / 2**20, 1) for p in peaks],
        "from_iteration": early,
        "to_iteration": len(peaks),
        "peak_rss_growth": (last - first) / first,
    }
