"""The sections that watch a run: validation on fixed instances, the early warnings and the experiment trackers."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from ragen_core.config.base import MAX_COUNT, MAX_SCALE, PositiveInt, Section, Seed
from ragen_core.config.trust import trusted_only

TRACKER_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def trackers_for_tensorboard(flag: bool) -> list[str]:
    """``monitor.trackers`` as the retired ``monitor.tensorboard`` flag said it: TensorBoard, or nothing."""
    return ["tensorboard"] if flag else []


class EvalConfig(Section):
    """Validation on fixed instances."""

    every: PositiveInt = Field(5, description="Validate every N iterations; iteration 0 = before any update.")
    instances: PositiveInt = Field(256, description="Fixed validation instances per environment.")
    k: PositiveInt = Field(1, description="Samples per instance; pass@k counts an instance solved if any succeeds.")
    temperature: float = Field(0.5, gt=0, le=100, description="Validation sampling temperature.")
    seed: Seed = Field(123, description="Seed of the fixed validation instances (shared by all runs; 0 to 2**32 - 1).")
    held_out: Literal["maps", "seeds"] = Field(
        "maps",
        description="What validation holds out. maps: an env whose instances are maps from a small space (Sokoban, "
        "FrozenLake) validates only on maps reserved for it (one in 8, by a hash of the map), which no training or "
        "bootstrap episode of any run draws; seeds: validation seeds differ from training ones, but two seeds may "
        "draw the same map (how runs stored before this key behaved).",
    )


class MlflowConfig(Section):
    """Where the ``mlflow`` tracker logs (``monitor.trackers``)."""

    tracking_uri: str | None = Field(
        None,
        min_length=1,
        max_length=2000,
        description="MLflow tracking URI (a server, sqlite:///..., databricks, ...). None: MLFLOW_TRACKING_URI when "
        "set, else a SQLite store in the run's folder (<data root>/runs/<run id>/trackers/mlflow/mlflow.db, "
        "artifacts beside it). A stored run's URI that names a host or a file outside the data root is used only "
        "when named again (docs/security.md).",
        json_schema_extra=trusted_only("tracker", env="MLFLOW_TRACKING_URI"),
    )
    experiment: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="MLflow experiment of the run. None: MLFLOW_EXPERIMENT_NAME when set, else 'ragen'.",
    )


class WandbConfig(Section):
    """Where the ``wandb`` tracker logs (``monitor.trackers``). Its mode is W&B's own WANDB_MODE (offline unless set):
    a config never sends metrics to a server by itself."""

    project: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="W&B project. None: WANDB_PROJECT when set, else 'ragen'.",
        json_schema_extra=trusted_only("account", env="WANDB_PROJECT"),
    )
    entity: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="W&B entity (user or team). None: WANDB_ENTITY when set, else the account's default.",
        json_schema_extra=trusted_only("account", env="WANDB_ENTITY"),
    )


class MonitorConfig(Section):
    """Echo-Trap early warnings: events recorded (and logged) while the run goes on; the trackers that show them."""

    warmup: NonNegativeInt = Field(2, le=MAX_COUNT, description="Iterations observed before any warning.")
    reward_std_drop: float = Field(
        0.5, gt=0, le=1, description="Warn when in-group reward std falls this fraction below its running peak."
    )
    entropy_drop: float = Field(
        0.5, gt=0, le=1, description="Warn when token entropy falls this fraction below its running peak."
    )
    grad_norm_spike: float = Field(
        5.0, gt=1, le=MAX_SCALE, description="Warn when the gradient norm exceeds this multiple of its running median."
    )
    converged_success: float = Field(
        0.9,
        gt=0,
        le=1,
        description="No reward-std or entropy drop warning while the rollout success rate is at least this: the "
        "spread of a policy that has converged on success falls because it succeeds, not because it collapses.",
    )
    success_slip: float | None = Field(
        0.05,
        ge=0,
        le=1,
        description="Warn of a reward-std or entropy drop, or a gradient spike, only while the policy loses ground: "
        "training success (3-iteration trailing mean) has fallen at least this much since the signal's peak (over "
        "the last 3 iterations for a spike). A healthy run's spread falls too as it converges; this tells them apart "
        "(calibrated on the echo_trap finding's runs: docs/findings.md). None: warn on the signals alone.",
    )
    truncated_share: float | None = Field(
        0.2,
        gt=0,
        le=1,
        description="Warn when this share of an iteration's training replies (or more) was cut at "
        "rollout.max_new_tokens without ending (rollout/truncated_rate): a policy that stops ending its replies "
        "collapses silently while its answers still score (the Bandit demo's went 0.01 -> 0.10 -> 0.36 -> 0.89 in "
        "three iterations; healthy strict-format runs stayed below 0.14). None: no such warning.",
    )
    trackers: list[str] = Field(
        default_factory=lambda: ["tensorboard"],
        max_length=8,
        description="Experiment trackers that get each committed iteration's metrics (step = iteration), the "
        "resolved config as params, the run id and tags, and the run's plot at the end: 'tensorboard' (event files "
        "under <data root>/runs/<run id>/tensorboard), 'mlflow' (monitor.mlflow; pip install ragen-flows[mlflow]), "
        "'wandb' (monitor.wandb, offline unless WANDB_MODE says otherwise; ragen-flows[wandb]). [] for none. The "
        "metrics table stays the source of truth: a tracker that fails warns once and the run goes on. Replaces "
        "monitor.tensorboard (true/false is still read as [tensorboard] / []).",
    )
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    mi_drop: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Warn of template collapse when the MI estimate (monitor.mi_metric; trainer.mi_diagnostic) "
        "stays more than this fraction below its running peak for monitor.mi_patience consecutive iterations.",
    )
    mi_patience: PositiveInt = Field(
        2, description="Consecutive iterations the MI must stay low before the template-collapse warning."
    )
    mi_metric: Literal["per_token", "sequence"] = Field(
        "per_token",
        description="Which MI estimate the template-collapse warning watches: 'per_token' "
        "(diag/reasoning_mi_per_token, RAGEN-2's headline collapse/mi_estimate) or 'sequence' (diag/reasoning_mi, "
        "summed log-probs: RAGEN-2's mi_seq_estimate).",
    )

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_flag(cls, data: Any) -> Any:
        """The retired ``monitor.tensorboard`` (a stored run's config, an old file) read as ``monitor.trackers``."""
        if not isinstance(data, dict) or "tensorboard" not in data:
            return data
        data = dict(data)
        flag = data.pop("tensorboard")
        if not isinstance(flag, bool):
            raise ValueError(f"monitor.tensorboard must be true or false, not {flag!r}; better: use monitor.trackers")
        if "trackers" not in data:
            return {**data, "trackers": trackers_for_tensorboard(flag)}
        trackers = data["trackers"]
        if isinstance(trackers, list) and ("tensorboard" in trackers) != flag:
            raise ValueError(
                f"monitor.tensorboard={str(flag).lower()} contradicts monitor.trackers={trackers}; "
                "give monitor.trackers only (monitor.tensorboard is its old spelling)"
            )
        return data

    @field_validator("trackers")
    @classmethod
    def _tracker_names(cls, trackers: list[str]) -> list[str]:
        bad = [name for name in trackers if not TRACKER_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"tracker names are lowercase words (tensorboard, mlflow, wandb), not {bad}")
        twice = sorted({name for name in trackers if trackers.count(name) > 1})
        if twice:
            raise ValueError(f"tracker(s) {', '.join(twice)} listed twice; list each once")
        return trackers
