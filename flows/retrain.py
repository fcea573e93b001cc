"""The ``retrain_offline`` flow: train a model on stored trajectories selected by SQL, as a normal run.

Two doors onto one procedure (:func:`ragen_core.run.procedures.retrain`): :func:`retrain_offline`, plain parameters
(a deployment's form), builds and admits the request in the flow run; :func:`retrain_admitted` runs a request its
caller built and admitted (the ``ragen retrain`` command)."""

from __future__ import annotations

from typing import Any

from flows import ui
from flows.train import PREFECT
from ragen_core.config import RunConfig
from ragen_core.run.procedures import Admission, admit
from ragen_core.run.procedures import retrain as retrain_procedure
from ragen_core.run.requests import RetrainInputs, RetrainRequest, retrain_request


def _tags(request: RetrainRequest) -> list[str]:
    return [*ui.run_tags(request.config.env.name, request.config.algorithm.preset), f"offline:{request.mode}"]


@ui.flow(name="retrain_offline", flow_run_name=ui.named_after("run_id"), validate_parameters=False)
def retrain_offline(
    config: RunConfig | dict[str, Any] | str | None,
    sql: str,
    init: str,
    mode: str = "sft",
    data_root: str = "data",
    run_id: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """[the request: selection, start model, tokenizer checked] -> session from ``init`` -> ``offline.epochs`` x
    (train, commit) -> validation.

    Each epoch is committed as an iteration (metrics; a checkpoint after the last one); validation runs before the
    first epoch and after the last, so the run compares with its sources in the same tables. Progress goes to the
    caller through :func:`flows.ui.watching`.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    given = dict(config=config, sql=sql, init=init, mode=mode, data_root=data_root)
    request = retrain_request(RetrainInputs.of(**given, run_id=run_id, overrides=overrides))
    with ui.showing(request.run_id, _tags(request)), admit(request) as admission:  # one writer per run
        return retrain_procedure(admission, PREFECT)


@ui.flow(name="retrain_offline", flow_run_name=ui.named_after_request("admission"), validate_parameters=False)
def retrain_admitted(admission: Admission) -> dict[str, Any]:
    """The ``retrain_offline`` flow of a request its caller built and admitted (the ``ragen retrain`` command)."""
    with ui.showing(admission.request.run_id, _tags(admission.request)):
        return retrain_procedure(admission, PREFECT)
