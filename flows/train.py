"""The ``train`` flow (fresh or resumed): two doors onto one course, the stages of
:func:`ragen_core.run.procedures.train` (open the session, the schedule's iterations, the final validation, close).

- :func:`train`, plain parameters (a deployment's form, a sweep's point, Python): the request is built here, once,
  and admitted (the run's writer lock taken, its start decided) in the flow run;
- :func:`train_admitted`, an admitted request (the ``ragen`` command, which built and admitted it before starting
  Prefect): nothing is built, taken or decided again.

Both run the stages with :data:`PREFECT`: each step a Prefect task, progress to Prefect's UI and the caller. The
Python API runs the same stages with direct calls (:func:`ragen_core.run.procedures.train`): the same run, bitwise.
"""

from __future__ import annotations

import logging
from typing import Any

from flows import ui
from ragen_core.config import RunConfig
from ragen_core.run.procedures import (
    Admission,
    Hooks,
    admit,
    open_training,
    restore_training,
    training_iterations,
    validate_final_policy,
)
from ragen_core.run.record import run_status
from ragen_core.run.requests import RunRequest, TrainInputs, resolve_config, run_request
from tasks import reporting as r
from tasks.iteration import call_as_task
from tasks.stages import call_as_session_task

# The run layer's steps as Prefect tasks (each named as the function it calls) and the flows' progress.
PREFECT = Hooks(
    call=call_as_task,
    call_step=call_as_session_task,
    step=ui.step,
    report=ui.report,
    publish=r.publish_iteration_artifact,
    artifacts=r.IterationArtifacts,
)

__all__ = ["PREFECT", "resolve_config", "train", "train_admitted"]


def _tags(request: RunRequest) -> list[str]:
    return ui.run_tags(request.config.env.name, request.config.algorithm.preset, (request.sweep or {}).get("id"))


def _stages(admission: Admission) -> dict[str, Any]:
    """The run, stage by stage, each stage's steps Prefect tasks: the result of
    :func:`ragen_core.run.procedures.train`."""
    run = open_training(admission, PREFECT)  # [bootstrap] -> session; resumed or extended; none when already done
    if run.session is None:
        return run.result
    with run_status(run.session):  # closed however it ends: the manifest says how
        first = restore_training(run, PREFECT)  # a resumed run's checkpoint and replayed updates
        final = training_iterations(run.session, first, PREFECT)  # trainer.iterations x the iteration's table
        validate_final_policy(run.session, final, PREFECT)  # committed as its own iteration
    return {**run.result, "first_iteration": first}


@ui.flow(name="train", flow_run_name=ui.named_after("run_id"), validate_parameters=False)
def train(
    config: RunConfig | dict[str, Any] | str | None = None,
    data_root: str = "data",
    run_id: str | None = None,
    force_config: list[str] | None = None,
    skip_iteration: bool = False,
    overrides: list[str] | None = None,
    sweep: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train one run: [bootstrap] -> session -> ``trainer.iterations`` x iteration -> final validation.

    ``config`` is a config tree or the path of a YAML file (deployments pass a path relative to the project), with
    ``overrides`` (``key.sub=value``) applied on top. An existing ``run_id`` is resumed from its last committed
    iteration (same config, unless ``force_config`` lists the keys allowed to change; ``skip_iteration`` skips an
    iteration whose batch was quarantined). ``sweep`` (``{id, point, overrides}``) is recorded in the manifest of a
    sweep's point. Progress goes to the caller through :func:`flows.ui.watching`, not a parameter.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    given = dict(config=config, data_root=data_root, run_id=run_id, force_config=force_config)
    request = run_request(TrainInputs.of(**given, skip_iteration=skip_iteration, overrides=overrides, sweep=sweep))
    with ui.showing(request.run_id, _tags(request)), admit(request) as admission:  # one writer per run
        note = admission.run.takeover_note
        if note:
            logging.getLogger(__name__).warning(note)
        return _stages(admission)


@ui.flow(name="train", flow_run_name=ui.named_after_request("admission"), validate_parameters=False)
def train_admitted(admission: Admission) -> dict[str, Any]:
    """The ``train`` flow of a request its caller built and admitted (the ``ragen`` command, holding the run's
    writer lock with its start decided): Prefect's UI shows the request's plain parameters."""
    with ui.showing(admission.request.run_id, _tags(admission.request)):
        return _stages(admission)
