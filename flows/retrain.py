"""The ``retrain_offline`` flow: train a model on stored trajectories selected by SQL, as a normal run."""

from __future__ import annotations

from typing import Any

from flows import ui
from flows.train import final_evaluation, resolve_config
from ragen_core.config import RunConfig
from ragen_core.run.entry import check_run_id, open_run, run_lake
from ragen_core.run.iteration import IterationState
from ragen_core.run.record import check_run_id_free, run_status
from ragen_core.run.stages import COMMIT, EVALUATION
from ragen_core.storage import DataLake
from tasks import offline as o
from tasks import stages as t
from tasks.iteration import call_as_task


@ui.flow(name="retrain_offline", flow_run_name=ui.named_after("run_id"), validate_parameters=False)
def retrain_offline(
    config: RunConfig | dict[str, Any] | str | None,
    sql: str,
    mode: str,
    init: str,
    data_root: str = "data",
    run_id: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """select -> check tokenizer -> session from ``init`` -> ``offline.epochs`` x (train, commit) -> validation.

    Each epoch is committed as an iteration (metrics; a checkpoint after the last one); validation runs before the
    first epoch and after the last, so the run compares with its sources in the same tables. Progress goes to the
    caller through :func:`flows.ui.watching`.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    check_run_id(run_id)  # a name, never a pattern or a path: refused before anything is read or created
    run_config = resolve_config(config, overrides)  # a tree, or a YAML path (deployments), plus key=value overrides
    epochs = run_config.offline.epochs  # each epoch is committed as an iteration: the run has `epochs` iterations
    trainer = run_config.trainer.model_copy(update={"iterations": epochs})  # both validated positive integers
    run_config = run_config.model_copy(update={"trainer": trainer})
    lake = run_lake(data_root)
    run_id = check_run_id(run_id or f"retrain-{mode}-{run_config.config_hash()[:8]}")
    tags = [*ui.run_tags(run_config.env.name, run_config.algorithm.preset), f"offline:{mode}"]
    with ui.showing(run_id, tags), open_run(lake, run_id):  # one writer per run (a second one is refused)
        return _retrain(run_config, lake, run_id, sql, mode, init)


def _retrain(
    run_config: RunConfig,
    lake: DataLake,
    run_id: str,
    sql: str,
    mode: str,
    init: str,
) -> dict[str, Any]:
    """The body of :func:`retrain_offline`, under the run's writer lock."""
    epochs = run_config.offline.epochs
    check_run_id_free(lake, run_id)
    init_dir = o.resolve_init(init, lake)
    table = o.select_trajectories(lake, sql)
    o.check_tokenizer(lake, table, init_dir)
    ui.step(f"{table.num_rows} stored trajectories selected; loading the model {init}")
    session = t.open_session(run_config, lake, run_id, init_dir)
    with run_status(session):
        session.record.update(kind="offline", lineage=o.lineage(sql, table, mode, init_dir, lake))
        for epoch in range(epochs):
            state = IterationState(updated=True, tell=ui.step)  # each epoch trains: its commit saves when due
            if epoch == 0:
                ui.step("validating the model before training")
                call_as_task(EVALUATION, session, 0, state)
            ui.step(f"epoch {epoch + 1} of {epochs}: {mode} over {table.num_rows} trajectories")
            state.metrics.update(o.offline_epoch(session, table, mode, epoch))
            call_as_task(COMMIT, session, epoch, state)
            ui.report(epoch, state.metrics)
        ui.step("validating the re-trained model")
        ui.report(epochs, final_evaluation(session, epochs, ui.step))
    return {"run_id": run_id, "data_root": str(lake.root), "trajectories": table.num_rows}
