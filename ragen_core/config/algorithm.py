"""The ``algorithm`` section (StarPO / StarPO-S / RAGEN-2) and its presets.

A key whose default depends on ``algorithm.preset`` is declared with :func:`preset_field`, which says each preset's
value at the field; :data:`PRESETS` is read back from those fields, so the table is written once.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, NonNegativeInt, model_validator
from pydantic_core import PydanticUndefined

from ragen_core.config.base import MAX_COUNT, MAX_SCALE, Scale, Section

Preset = Literal["starpo", "starpo_s", "ragen2"]
PRESET_NAMES: tuple[str, ...] = get_args(Preset)
FilterMetric = Literal["reward_std", "reward", "reward_sum", "entropy", "entropy_variance", "length"]
_UNSET: Any = object()


def preset_field(
    *,
    description: str,
    default: Any = PydanticUndefined,
    starpo: Any = _UNSET,
    starpo_s: Any = _UNSET,
    ragen2: Any = _UNSET,
    **constraints: Any,
) -> Any:
    """A field of :class:`AlgorithmConfig` whose value depends on the preset: each preset's value (a preset left out
    takes ``default``; a field without a default names every preset). Keys the user gives override the preset's."""
    values = {name: value for name, value in zip(PRESET_NAMES, (starpo, starpo_s, ragen2), strict=True)}
    values = {name: value for name, value in values.items() if value is not _UNSET}
    if default is PydanticUndefined and len(values) != len(PRESET_NAMES):
        raise TypeError(f"a preset field without a default names every preset ({', '.join(PRESET_NAMES)})")
    return Field(default, description=description, json_schema_extra={"presets": values}, **constraints)


class AlgorithmConfig(Section):
    """StarPO / StarPO-S settings. Keys left out take the preset's value; keys given override it."""

    preset: Preset = Field(
        "starpo_s",
        description="Vanilla StarPO, stabilised StarPO-S, or ragen2: StarPO-S with RAGEN-2's recommended filter "
        "(top_p over reward_std at 0.9, linear mass, zero-std groups excluded). See PRESETS for the keys each sets.",
    )
    adv_estimator: str = Field(
        "grpo",
        description="Registered advantage estimator: grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, "
        "gae (PPO with a critic) or bi_level_gae (turn-level GAE with a critic).",
    )
    norm_adv_by_std: bool = Field(True, description="GRPO: divide group-centred scores by the group std.")
    grpo_grouping: Literal["state", "batch"] = Field(
        "state", description="GRPO: normalise within each initial state's group, or over the whole batch."
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Token-level discount (GAE, REINFORCE++); paper: 1.0.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda; paper: 1.0.")
    high_level_gamma: float = Field(0.95, ge=0, le=1, description="Bi-level GAE: discount across turns.")
    whiten_advantages: bool = Field(True, description="GAE / bi-level GAE: whiten advantages over the batch.")
    reward_level: Literal["trajectory", "turn"] = Field(
        "trajectory",
        description="'trajectory': the trajectory score on its last assistant token; 'turn': each turn's reward "
        "(env reward + format penalty) on that turn's last token (for bi_level_gae).",
    )
    policy_loss: str = Field(
        "dual_clip",
        description="Registered policy loss: dual_clip (PPO with decoupled clip, negative advantages further bounded "
        "by clip_ratio_c, as RAGEN/veRL always apply it) or ppo (decoupled clip only).",
    )
    clip_low: float = preset_field(
        starpo=0.2, starpo_s=0.2, ragen2=0.2, ge=0, le=1, description="PPO clip below 1 (ratio >= 1 - clip_low)."
    )
    clip_high: Scale = preset_field(
        starpo=0.2,
        starpo_s=0.28,
        ragen2=0.28,
        description="PPO clip above 1 (ratio <= 1 + clip_high); StarPO-S: 0.28.",
    )
    clip_ratio_c: float = Field(
        3.0, gt=1, le=MAX_SCALE, description="Dual-clip bound for negative advantages (dual_clip loss)."
    )
    kl_coef: Scale = preset_field(
        starpo=0.001,
        starpo_s=0.0,
        ragen2=0.0,
        description="KL coefficient to the frozen initial policy; 0 = off.",
    )
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="Apply KL as a loss term (RAGEN's default) or subtract it from the token rewards."
    )
    kl_estimator: Literal["k1", "k2", "k3", "kl", "mse", "low_var_kl", "abs"] = Field(
        "k1", description="KL estimator: k1 (kl, RAGEN's), k2 (mse), k3 (low_var_kl) or abs."
    )
    kl_span: Literal["reply", "think"] = Field(
        "reply",
        description="The tokens the KL term covers: 'reply' every trained token (RAGEN's), 'think' only each reply's "
        "thinking (up to and including </think>): an anchor on what the model perceives that leaves its answer free.",
    )
    entropy_coef: Scale = Field(0.001, description="Entropy bonus coefficient.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "seq-mean-token-mean",
        description="Loss reduction: seq-mean-token-mean (each trajectory's token mean, averaged over trajectories: "
        "the paper's equation and what RAGEN's code computes with one trajectory per micro-batch), token-mean (over "
        "all tokens of the mini-batch) or seq-mean-token-sum.",
    )
    filter: str = preset_field(
        default="std",
        ragen2="top_p",
        description="Group-selection strategy (RAGEN-2's rollout filter): top_k (keep the first filter_ratio share "
        "of groups by filter_metric), top_k_abs (keep filter_ratio groups), top_p (nucleus over the metric, see "
        "filter_top_p_mode) or min_p (keep groups within a factor filter_ratio of the best). Aliases: std = top_k, "
        "std_rev = top_k keeping the smallest, std_top_p = top_p linear (all three over reward_std).",
    )
    filter_ratio: float = preset_field(
        starpo=1.0,
        starpo_s=0.25,
        ragen2=0.9,
        gt=0,
        le=MAX_COUNT,
        description="The strategy's value: top_k share of groups kept, top_p mass, min_p factor (all in (0, 1]; "
        "1.0 keeps everything under top_k and top_p); top_k_abs: number of groups kept (a whole number >= 1).",
    )
    filter_metric: FilterMetric = preset_field(
        default="reward_std",
        ragen2="reward_std",
        description="Per-group value the strategy ranks: in-group std of trajectory scores, their mean or sum, the "
        "mean or in-group std of the trajectories' entropy (see filter_entropy) or the mean number of sampled tokens.",
    )
    filter_entropy: Literal["sampled", "full"] = Field(
        "sampled",
        description="entropy / entropy_variance: a trajectory's entropy is the mean over its sampled tokens of "
        "'sampled': the sampled token's negative behaviour log-prob (free: stored by the sampler), or 'full': the "
        "entropy of the policy's whole next-token distribution at the sampling temperature (RAGEN-2's; one forward "
        "pass over the batch in the filter stage).",
    )
    filter_largest: bool | None = Field(
        None,
        description="Keep the groups with the largest metric (true) or the smallest (false); None: largest "
        "(std_rev: smallest).",
    )
    filter_include_zero: bool = preset_field(
        default=True,
        ragen2=False,
        description="Whether groups whose ranked value is zero (|value| <= 1e-10; for reward_std: rewards that do "
        "not vary; for reward: a zero mean) may be kept, as RAGEN-2's rollout_filter_include_zero.",
    )
    filter_top_p_mode: Literal["linear", "softmax"] = preset_field(
        default="linear",
        ragen2="linear",
        description="top_p: 'linear' keeps the shortest prefix whose metric sum reaches filter_ratio of the total "
        "minus filter_eps (nothing if it cannot); 'softmax' the shortest prefix whose softmax mass reaches it.",
    )
    filter_eps: Scale = Field(
        0.01, description="top_p linear: slack subtracted from the target sum (RAGEN's selection epsilon)."
    )
    filter_loss_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none",
        description="RAGEN-2's filter_loss_scaling: multiply every advantage by the share of groups the filter kept "
        "('linear') or its square root ('sqrt'), so a heavily filtered batch takes a smaller step; 'none': unscaled.",
    )
    filter_empty_stop_steps: NonNegativeInt = Field(
        5,
        le=MAX_COUNT,
        description="RAGEN-2's rollout_filter_empty_stop_steps: stop training after this many consecutive training "
        "iterations whose filter kept no group (then the final validation runs); 0: never stop.",
    )
    soft_advantage_reweight: bool = Field(
        False,
        description="RAGEN-2's soft advantage reweighting (grpo only): multiply each kept trajectory's advantage by "
        "its group's reward std over the largest kept group's (std / (max std + 1e-6)), down-weighting low-variance "
        "groups instead of dropping them.",
    )

    off_policy_correction: Literal["none", "decoupled", "tis"] = Field(
        "none",
        description="How the loss treats rows the sampler drew from an older policy than the one the update starts "
        "from (trainer.max_staleness >= 1, or a vLLM sampler whose kernels differ). 'none': PPO against the old "
        "log-probs alone (actor.reuse_behavior_logprobs). 'decoupled': decoupled PPO (AReaL): the clip is taken "
        "against the proximal policy (the policy at the start of the update, re-scored) and each token's loss is "
        "weighted by proximal / behaviour probability, tokens whose weight exceeds algorithm.is_cap left out. 'tis': "
        "the same weight truncated at algorithm.is_cap (truncated importance sampling). Both need the sampler's "
        "stored log-probs (docs/algorithms.md, 'Off-policy correction').",
    )
    is_cap: float | None = Field(
        None,
        gt=1,
        le=MAX_SCALE,
        description="The importance weight's bound: 'tis' truncates the weight at it (None: 2.0); 'decoupled' leaves "
        "out tokens whose weight exceeds it (None: no bound, AReaL's default). Unused by 'none'.",
    )

    @model_validator(mode="after")
    def _check_filter(self) -> AlgorithmConfig:
        # the filter's name and options are checked against its registry by the loader (ragen_core.run.checks)
        if self.filter_entropy == "full" and self.filter_metric not in ("entropy", "entropy_variance"):
            raise ValueError(
                f"algorithm.filter_entropy=full only applies to the entropy metrics: set algorithm.filter_metric to "
                f"entropy or entropy_variance, or drop filter_entropy (filter_metric is {self.filter_metric})"
            )
        if self.soft_advantage_reweight and self.adv_estimator != "grpo":
            raise ValueError(
                f"algorithm.soft_advantage_reweight weights GRPO's group advantages by the group's reward std (as "
                f"RAGEN-2, where only grpo has it): set algorithm.adv_estimator=grpo, not {self.adv_estimator}"
            )
        if self.is_cap is not None and self.off_policy_correction == "none":
            raise ValueError(
                "algorithm.is_cap bounds the off-policy correction's importance weight: set "
                "algorithm.off_policy_correction=decoupled or tis, or drop is_cap"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        preset = data.get("preset", "starpo_s")
        defaults = PRESETS.get(preset)
        if defaults is None:
            return data  # the Literal check reports the bad preset name
        return {**defaults, **data}


def _preset_table(section: type[Section]) -> dict[str, dict[str, Any]]:
    """Each preset's values, read from the fields declared with :func:`preset_field`."""
    table: dict[str, dict[str, Any]] = {name: {} for name in PRESET_NAMES}
    for name, field in section.model_fields.items():
        extra = field.json_schema_extra
        presets = extra.get("presets") if isinstance(extra, dict) else None
        for preset, value in (presets or {}).items():  # type: ignore[union-attr]
            table[preset][name] = value
    return table


# What each preset sets (the RAGEN paper): StarPO-S = decoupled clip, no KL, variance filter keeping 25% of groups.
# ragen2: RAGEN-2's recommended setting (its README's SNR-adaptive filtering and filtering runs): StarPO-S's clip and
# KL, the top-p filter over reward std at 0.9 with linear mass, groups without reward variance excluded.
PRESETS: dict[str, dict[str, Any]] = _preset_table(AlgorithmConfig)
