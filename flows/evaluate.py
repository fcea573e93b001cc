"""The ``evaluate`` flow: validation rollouts of a run's checkpoint or any model folder, stored as its own run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows import ui
from ragen_core.config import RunConfig
from ragen_core.run import evaluation as e
from ragen_core.run.entry import check_run_id, open_run, run_lake
from ragen_core.run.iteration import IterationState
from ragen_core.run.record import run_status
from ragen_core.run.stages import FINAL_VALIDATION
from ragen_core.storage import DataLake
from tasks import reporting as r
from tasks import stages as t
from tasks.iteration import call_as_task


@ui.flow(name="evaluate", flow_run_name=ui.named_after("run_id"), validate_parameters=False)
def evaluate(
    target: str,
    envs: list[str] | None = None,
    n: int | None = None,
    data_root: str = "data",
    config: str | None = None,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    run_config: RunConfig | None = None,
    trust_env_module: bool = False,
) -> dict[str, Any]:
    """resolve the target -> session (no optimizer state, no critic) -> validation of every env -> commit.

    ``target``: a run id (newest checkpoint; ``RUN_ID@N`` for the one after N updates), a checkpoint folder or a
    Hugging Face model folder. ``envs``/``n`` set the validation envs and instances; the base config is the source
    run's (or ``config``, a YAML path). The same evaluation again returns the stored result; an interrupted one is
    finished, reusing the envs it had completed. ``run_config``: the evaluation's config as the caller resolved it from
    the same arguments (the CLI, having validated it: a config is validated once), used as it is.
    ``trust_env_module``: the source run's stored config may name modules to import (its envs as
    ``package.module:Class``, a reward function) without the overrides naming them again.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    check_run_id(run_id)  # a name, never a pattern or a path: refused before anything is read or created
    lake = run_lake(data_root)
    model_dir, base, which = e.resolve_target(target, lake)
    if run_config is None:
        kinds = frozenset({"module"}) if trust_env_module else frozenset()
        run_config = e.evaluation_config(base, envs, n, config, overrides, kinds)
    run_id = check_run_id(run_id or e.evaluation_run_id(which, run_config, lake))
    tags = [*ui.run_tags(run_config.env.name, run_config.algorithm.preset), "evaluation"]
    with ui.showing(run_id, tags), open_run(lake, run_id):  # one writer per run: never the same one twice
        return _evaluate(lake, run_config, run_id, target, which, model_dir)


def _evaluate(lake: DataLake, run_config: RunConfig, run_id: str, target: str, which: str, model_dir: Path) -> dict:
    """The body of :func:`evaluate`, under the evaluation run's writer lock."""
    manifest = lake.read_manifest(run_id)
    if manifest is not None and 0 in lake.committed_iterations(run_id):
        return _result(lake, run_id, which, reused=True)
    if manifest is not None:
        lake.discard_uncommitted(run_id, 0)
    ui.step(f"evaluation run {run_id}: loading the policy {which}")
    session = t.open_session(run_config, lake, run_id, model_dir, manifest, training=False)
    with run_status(session):
        evaluated = {"target": target, "model": which, "model_dir": str(model_dir)}
        session.record.update(kind="evaluation", evaluated=evaluated)
        state = IterationState(tell=ui.step)
        for step in FINAL_VALIDATION:  # untimed: an evaluation run's metrics are its validation's
            call_as_task(step, session, 0, state)
        metrics = state.metrics
    ui.report(0, metrics)
    r.publish_iteration_artifact(run_id, 0, metrics)
    return _result(lake, run_id, which, reused=False)


def _result(lake: DataLake, run_id: str, which: str, reused: bool) -> dict[str, Any]:
    rows = lake.read_table("evaluations", run_id).to_pylist()
    return {
        "run_id": run_id,
        "model": which,
        "data_root": str(Path(lake.root).resolve()),
        "reused": reused,
        "evaluations": [
            {k: row[k] for k in ("env", "instances", "k", "success_rate", "pass_at_k", "reward_mean")} for row in rows
        ],
    }
