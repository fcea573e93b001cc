"""What a user gives each command, one model per command, whichever door it comes through: the ``ragen`` command
line, a Prefect deployment's flow run (the flow's parameters) or the Python API (:mod:`ragen_core.api`).

Each field is described once here: the command line's help and the API's documentation say the same. The models
check only the kinds of values (a typo'd field is named); everything else is checked by the command's request
builder (:mod:`ragen_core.run.requests`), so that every door refuses the same input with the same message. This
module imports nothing heavy: the command line reads the descriptions at start-up.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class RequestError(ValueError):
    """What a user asked for cannot be a request (a run to resume that is not there, an unknown mode): one line that
    says how to fix it."""


class CommandInputs(BaseModel):
    """What a user gives one command, whichever door: no unknown field (a typo is named), frozen, any Python value
    where a door may pass one (a :class:`RunConfig`, a :class:`DataLake`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    @classmethod
    def of(cls, **values: Any):
        """The inputs, or :class:`RequestError` naming the first field of the wrong kind (one line)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or cls.__name__
            given = "" if first["type"] == "missing" else f" (given {first.get('input')!r})"
            raise RequestError(f"{where}: {first['msg']}{given}") from None

    @classmethod
    def describe(cls, name: str) -> str:
        """The field's one description: the command line's help, the API's and the deployment form's."""
        return cls.model_fields[name].description or ""


CONFIG = "A YAML config path (relative to the project), a config tree or a RunConfig; none: the defaults."
OVERRIDES = "key.sub=value overrides applied on top of the config, e.g. trainer.iterations=5."
DATA_ROOT = "The data root: the folder of the lake."
FORCE_CONFIG = "Config keys (or sections) allowed to differ from the stored run's, e.g. trainer.iterations, eval."
SKIP = "Record a quarantined iteration as skipped (no update) and go on."
TRUST = (
    "Let a config read back from the data root import the modules it names (its envs as package.module:Class, "
    "a reward function) without the overrides naming them again."
)


class TrainInputs(CommandInputs):
    """``ragen train``, the ``train`` flow and :func:`ragen_core.api.train`."""

    config: Any = Field(None, description=CONFIG)
    data_root: Any = Field("data", description=DATA_ROOT + " Made when missing.")
    run_id: str | None = Field(
        None,
        description="Run id (default <env>-<hash>-<time>); an existing unfinished run with the same config is "
        "resumed.",
    )
    force_config: list[str] | None = Field(None, description=FORCE_CONFIG)
    skip_iteration: bool = Field(False, description=SKIP)
    overrides: list[str] | None = Field(None, description=OVERRIDES)
    sweep: dict[str, Any] | None = Field(None, description="The sweep entry of a sweep's point (set by the sweep).")


class ResumeInputs(CommandInputs):
    """``ragen resume`` and :func:`ragen_core.api.resume` (a deployment resumes through ``train``'s run id)."""

    run_id: str = Field(description="The run to continue.")
    data_root: Any = Field("data", description=DATA_ROOT)
    overrides: list[str] | None = Field(None, description=OVERRIDES)
    force_config: list[str] | None = Field(None, description=FORCE_CONFIG)
    skip_iteration: bool = Field(False, description=SKIP)
    trust_env_module: bool = Field(False, description=TRUST)


class EvalInputs(CommandInputs):
    """``ragen eval``, the ``evaluate`` flow and :func:`ragen_core.api.evaluate`."""

    target: str = Field(
        description="RUN_ID (newest checkpoint; a LoRA run's: its adapters on its start model), RUN_ID@N, a "
        "checkpoint or a model folder."
    )
    data_root: Any = Field("data", description=DATA_ROOT)
    envs: list[str] | None = Field(None, description="Validation envs (default: the run's).")
    n: int | None = Field(None, description="Fixed validation instances per env (default: eval.instances).")
    config: Any = Field(None, description="A YAML config path (default: the run's, or the defaults).")
    overrides: list[str] | None = Field(None, description=OVERRIDES)
    run_id: str | None = Field(None, description="Evaluation run id (default evaluate-<model>-<hash>).")
    trust_env_module: bool = Field(False, description=TRUST)


class RetrainInputs(CommandInputs):
    """``ragen retrain``, the ``retrain_offline`` flow and :func:`ragen_core.api.retrain`."""

    config: Any = Field(description=CONFIG)  # required, as the command line passes it: None is the defaults
    sql: str = Field(
        description="SQL selecting the trajectories (must return their key columns), e.g. "
        "\"SELECT * FROM trajectories WHERE run_id = 'r1' AND success\"."
    )
    init: str = Field(
        description="Model folder, checkpoint folder (its hf/ export, or a LoRA run's adapters on its start model), "
        "run:<id> (the model that run started from) or run:<id>@<updates> (its checkpoint)."
    )
    mode: str = Field(
        "sft",
        description="sft (cross-entropy on the replies) or pg (StarPO loss with importance weights from the stored "
        "behaviour log-probs).",
    )
    data_root: Any = Field("data", description=DATA_ROOT + " It must hold the trajectories.")
    run_id: str | None = Field(None, description="Id of the new run (default retrain-<mode>-<hash>).")
    overrides: list[str] | None = Field(None, description=OVERRIDES)


__all__ = ["CommandInputs", "EvalInputs", "RequestError", "ResumeInputs", "RetrainInputs", "TrainInputs"]
