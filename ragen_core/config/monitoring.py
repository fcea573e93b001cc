"""The sections that watch a run: validation on fixed instances and the early warnings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt

from ragen_core.config.base import MAX_COUNT, MAX_SCALE, PositiveInt, Section, Seed


class EvalConfig(Section):
    """Validation on fixed instances."""

    every: PositiveInt = Field(5, description="Validate every N iterations; iteration 0 = before any update.")
    instances: PositiveInt = Field(256, description="Fixed validation instances per environment.")
    k: PositiveInt = Field(1, description="Samples per instance; pass@k counts an instance solved if any succeeds.")
    temperature: float = Field(0.5, gt=0, le=100, description="Validation sampling temperature.")
    seed: Seed = Field(123, description="Seed of the fixed validation instances (shared by all runs; 0 to 2**32 - 1).")


class MonitorConfig(Section):
    """Echo-Trap early warnings: events recorded (and logged) while the run goes on."""

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
    tensorboard: bool = Field(
        True,
        description="Also write each committed iteration's metrics as TensorBoard scalars (step = iteration) under "
        "<data root>/runs/<run id>/tensorboard; the metrics table stays the source of truth.",
    )
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
