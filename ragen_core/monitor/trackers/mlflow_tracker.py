"""The ``mlflow`` tracker: one MLflow run per ragen run, through :class:`mlflow.tracking.MlflowClient` (no global
"active run", so several runs of one process never mix).

Where: ``monitor.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a SQLite store in the run's folder
(``runs/<run id>/trackers/mlflow/mlflow.db``, artifacts in ``.../mlflow/artifacts``; ``mlflow ui
--backend-store-uri sqlite:///<that file>`` shows it). The experiment is ``monitor.mlflow.experiment``, else
``MLFLOW_EXPERIMENT_NAME``, else ``ragen``. The run is named after the ragen run, tagged, and holds the flattened
config as params; a resumed attempt reopens the MLflow run whose id the run's folder keeps (when the store is the
same), adding only the params it lacks (MLflow never changes a logged param). MLflow's names take letters, digits,
``_ - . : /`` and spaces only: ``@`` is spelled ``_at_`` (``val/bandit/pass@k`` is ``val/bandit/pass_at_k``) and
any other character ``_`` (:func:`mlflow_name`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragen_core.monitor.trackers.base import TRACKERS, RunEnd, TrackerRun, TrackerSpec

DEFAULT_EXPERIMENT = "ragen"
RUN_FOLDER_STORE = "run folder"  # the state's name of the default store, which moves with the data root
MAX_PARAM_VALUE = 6000  # MLflow's limit on a param's value
BATCH = 100  # params per request (MLflow takes at most 100 params, 1000 metrics in one log_batch)
STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
NOT_IN_NAMES = re.compile(r"[^/\w.\- :]")  # MLflow's rule for metric and param names (POSIX)


class MlflowTracker:
    """An open MLflow run."""

    def __init__(self, client: Any, run_id: str, store: str) -> None:
        self.client, self.run_id, self.store = client, run_id, store

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "store": self.store}

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(name), float(scalars[name]), now, step) for name in sorted(scalars)]
        for start in range(0, len(metrics), 10 * BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 10 * BATCH])

    def finish(self, status: RunEnd, plot: Path | None) -> None:
        if plot is not None:
            self.client.log_artifact(self.run_id, str(plot))
        self.client.set_terminated(self.run_id, STATUS[status])


def mlflow_name(name: str) -> str:
    """A metric or param name as MLflow takes it: ``@`` as ``_at_``, any other character it refuses as ``_``."""
    return NOT_IN_NAMES.sub(lambda found: "_at_" if found.group() == "@" else "_", name)


def param_text(value: Any) -> str:
    """A config value as an MLflow param: text as it is, anything else as JSON (``true``, ``null``, ``["a"]``),
    cut to MLflow's limit."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_PARAM_VALUE else text[: MAX_PARAM_VALUE - 3] + "..."


def open_mlflow(run: TrackerRun) -> MlflowTracker:
    """The MLflow run of ``run``: the stored one when its store is this one, else a new one; tags and params set."""
    from mlflow.tracking import MlflowClient

    settings = run.settings.mlflow
    uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
    folder = run.subfolder("mlflow")
    if uri is None:
        folder.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{folder.resolve() / 'mlflow.db'}"
    store = RUN_FOLDER_STORE if uri.startswith(f"sqlite:///{folder.resolve()}") else uri
    client = MlflowClient(tracking_uri=uri)
    run_id = _reopened(client, run.stored.get("run_id")) if run.stored.get("store") == store else None
    if run_id is None:
        experiment = settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        artifacts = (folder / "artifacts").resolve().as_uri() if store == RUN_FOLDER_STORE else None
        run_id = client.create_run(_experiment_id(client, experiment, artifacts), run_name=run.run_id).info.run_id
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(f"ragen.{name}", value) for name, value in run.tags.items()])
    _log_params(client, run_id, run.params)
    return MlflowTracker(client, run_id, store)


def _reopened(client: Any, run_id: Any) -> str | None:
    """``run_id`` marked running again, when the store still has it (not deleted); else None."""
    if not isinstance(run_id, str):
        return None
    from mlflow.exceptions import MlflowException

    try:
        found = client.get_run(run_id)
    except MlflowException:
        return None
    if found.info.lifecycle_stage != "active":
        return None
    client.update_run(run_id, status="RUNNING")
    return run_id


def _experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created (artifacts at ``artifact_location``) when the store has none."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # another process created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _log_params(client: Any, run_id: str, params: Mapping[str, Any]) -> None:
    """Log the params the MLflow run lacks (a resumed run's changed key keeps its first value: MLflow's rule)."""
    from mlflow.entities import Param

    have = client.get_run(run_id).data.params
    named = {mlflow_name(key): param_text(value) for key, value in sorted(params.items())}
    new = [Param(key, value) for key, value in named.items() if key not in have]
    for start in range(0, len(new), BATCH):
        client.log_batch(run_id, params=new[start : start + BATCH])


TRACKERS.add("mlflow", TrackerSpec(open_mlflow, package="mlflow", extra="mlflow"))
