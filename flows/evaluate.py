"""The ``evaluate`` flow: validation rollouts of a run's checkpoint or any model folder, stored as its own run.

Two doors onto one procedure (:func:`ragen_core.run.procedures.evaluate`): :func:`evaluate`, plain parameters (a
deployment's form), builds and admits the request in the flow run; :func:`evaluate_admitted` runs a request its
caller built and admitted (the ``ragen eval`` command)."""

from __future__ import annotations

from typing import Any

from flows import ui
from flows.train import PREFECT
from ragen_core.run.procedures import Admission, admit
from ragen_core.run.procedures import evaluate as evaluate_procedure
from ragen_core.run.requests import EvalInputs, EvalRequest, eval_request


def _tags(request: EvalRequest) -> list[str]:
    return [*ui.run_tags(request.config.env.name, request.config.algorithm.preset), "evaluation"]


@ui.flow(name="evaluate", flow_run_name=ui.named_after("run_id"), validate_parameters=False)
def evaluate(
    target: str,
    envs: list[str] | None = None,
    n: int | None = None,
    data_root: str = "data",
    config: str | None = None,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    trust_env_module: bool = False,
) -> dict[str, Any]:
    """resolve the target -> session (no optimizer state, no critic) -> validation of every env -> commit.

    ``target``: a run id (newest checkpoint; ``RUN_ID@N`` for the one after N updates), a checkpoint folder or a
    Hugging Face model folder. ``envs``/``n`` set the validation envs and instances; the base config is the source
    run's (or ``config``, a YAML path). The same evaluation again returns the stored result; an interrupted one is
    finished, reusing the envs it had completed. ``trust_env_module``: the source run's stored config may name
    modules to import (its envs as ``package.module:Class``, a reward function) without the overrides naming them
    again.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    given = dict(target=target, data_root=data_root, envs=envs, n=n, config=config, overrides=overrides)
    request = eval_request(EvalInputs.of(**given, run_id=run_id, trust_env_module=trust_env_module))
    with ui.showing(request.run_id, _tags(request)), admit(request) as admission:  # one writer per run
        return evaluate_procedure(admission, PREFECT)


@ui.flow(name="evaluate", flow_run_name=ui.named_after_request("admission"), validate_parameters=False)
def evaluate_admitted(admission: Admission) -> dict[str, Any]:
    """The ``evaluate`` flow of a request its caller built and admitted (the ``ragen eval`` command)."""
    with ui.showing(admission.request.run_id, _tags(admission.request)):
        return evaluate_procedure(admission, PREFECT)
