"""One validated, frozen config tree for a RAGEN-Flows run.

Configs load from YAML and accept ``key.sub=value`` overrides (values parsed as YAML, so ``0.5``, ``true``,
``[1, 2]`` keep their types). Unknown keys, wrong types and out-of-range values fail at load time with a
message naming the key, before any compute is spent. ``config_hash`` is a stable digest of the resolved tree
(sorted-key JSON), used to tell whether two runs trained with the same settings.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

# Every count of the config (iterations, instances, groups, tokens, ...) is at most a million: a larger one is a typo
# (10**12 iterations) that would otherwise pass validation and fail, or run for ever, after the run was created.
MAX_COUNT = 1_000_000
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
MAX_NEW_TOKENS = 131_072  # longer than any model's context here: a larger reply limit is a mistake

if TYPE_CHECKING:
    from ragen_core.algos.filters import FilterSpec

class ConfigError(ValueError):
    """A config that cannot be used: the message names every offending key and how to fix it."""


class _Section(BaseModel):
    # inf and nan are no setting of any key (actor.lr=inf would pass and fail at the first update)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Pydantic would read ``true`` as 1 for a number and ``1`` as true for a boolean, and YAML reads ``yes``,
        ``no``, ``on`` and ``off`` as booleans: a boolean key takes only true/false, no other key takes them."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None or value is None:
            return value
        leaves = _leaf_types(field.annotation)
        takes_bool = bool in leaves or Any in leaves
        if isinstance(value, bool) and not takes_bool:
            kind = "a number" if leaves & {int, float} else "text" if str in leaves else "another type"
            fix = "write the number" if kind == "a number" else 'quote the word (e.g. "yes")' if kind == "text" else ""
            raise ValueError(
                f"got the boolean {str(value).lower()} (YAML also reads yes/no/on/off as booleans), but this key "
                f"takes {kind}{': ' + fix if fix else ''}"
            )
        if takes_bool and leaves - {type(None)} == {bool} and not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {value!r}")
        return value


def _leaf_types(annotation: Any) -> set[Any]:
    """The plain types an annotation accepts: unions and Optional unpacked, Literal values as their types."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return set().union(*(_leaf_types(arg) for arg in get_args(annotation)))
    if origin is Literal:
        return {type(arg) for arg in get_args(annotation)}
    if origin is Annotated:
        return _leaf_types(get_args(annotation)[0])
    return {origin or annotation}


class TinyModelConfig(_Section):
    """Shape of the tiny randomly initialised Qwen2-architecture default model (built locally, no download)."""

    hidden_size: PositiveInt = Field(64, description="Model width.")
    num_layers: PositiveInt = Field(2, description="Number of transformer blocks.")
    num_heads: PositiveInt = Field(
        2, description="Attention heads; must divide hidden_size. Heads of 32 (64 / 2): vLLM's CPU attention takes "
        "head sizes of 32 and more."
    )
    num_kv_heads: PositiveInt = Field(
        1, description="Key/value heads (grouped-query attention); must divide num_heads."
    )
    intermediate_size: PositiveInt = Field(256, description="MLP width.")
    vocab_size: PositiveInt = Field(1024, description="Target BPE vocabulary size of the locally trained tokenizer.")
    seed: int = Field(0, description="Seed of the weight initialisation.")

    @model_validator(mode="after")
    def _check_heads(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.tiny.num_heads={self.num_heads} must divide hidden_size={self.hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.tiny.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        return self


class ModelConfig(_Section):
    """Which policy model to start from."""

    path: str | None = Field(
        None, description="Local Hugging Face causal-LM directory. None: the tiny default, built under the data root."
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the tiny default model.")


class EnvConfig(_Section):
    """The training environment and the per-trajectory interaction limits (enforced by the rollout layer)."""

    name: str = Field("bandit", description="Registered environment name used for training rollouts.")
    val_envs: list[str] | None = Field(None, description="Environments evaluated during validation; None: [name].")
    max_turns: PositiveInt = Field(1, description="Maximum turns (model replies) per trajectory.")
    max_actions_per_turn: PositiveInt = Field(1, description="Actions parsed from one reply (split on '||').")
    max_actions_per_traj: PositiveInt = Field(1, description="Action budget of a whole trajectory.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword overrides passed to make_env.")

    @property
    def validation_envs(self) -> list[str]:
        return list(self.val_envs) if self.val_envs else [self.name]


class VLLMConfig(_Section):
    """The vLLM rollout server (``rollout.backend: vllm``): started with the run from the vLLM environment
    (``make install-vllm``), weights pushed after every update and checked."""

    python: str | None = Field(
        None,
        description="Python of the vLLM environment; None: $RAGEN_VLLM_PYTHON, else .venv-vllm beside this "
        "project's environment (where `make install-vllm` builds it).",
    )
    tensor_parallel_size: PositiveInt = Field(1, description="GPUs the server shards the policy over.")
    gpu_memory_utilization: float = Field(
        0.4,
        gt=0,
        le=1,
        description="GPU machines: share of each GPU's memory vLLM may take (weights + KV cache); the rest is left to "
        "the DeepSpeed engines that share the GPU.",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        le=1024,
        description="KV cache size in GiB; None: 1 GiB on the CPU (over 2 million tokens of the tiny model), "
        "gpu_memory_utilization on a GPU.",
    )
    enforce_eager: bool = Field(
        False, description="Skip vLLM's compilation (CUDA graphs, torch.compile): faster start, slower decoding."
    )
    prefix_caching: bool = Field(
        True,
        description="Later turns of a multi-turn rollout reuse the keys and values of its earlier turns (emptied "
        "before every rollout, so resumes stay exact); false recomputes every prompt (measured on multi-turn Sokoban "
        "at the 20M model: 0.5x the Hugging Face backend's tokens per second instead of 2x).",
    )
    max_model_len: Annotated[int, Field(gt=0, le=MAX_NEW_TOKENS)] | None = Field(
        None, description="Longest sequence (prompt + reply) the server serves; None: the model's own limit."
    )
    startup_timeout: float = Field(
        900.0, gt=0, le=86400, description="Seconds to wait for the server's engine to be ready."
    )
    check_tolerance: float | None = Field(
        None,
        gt=0,
        description="After every weight push the server scores a probe sequence; the largest log-prob difference "
        "from the trainer's model must stay within this. None: 1e-4 in float32, 0.1 in bf16/fp16.",
    )


class RolloutConfig(_Section):
    """How training rollouts are generated."""

    env_groups: PositiveInt = Field(8, description="Initial states (groups) per iteration (paper: P=8).")
    group_size: PositiveInt = Field(16, description="Rollouts per initial state; members share the env seed (N=16).")
    backend: Literal["hf", "vllm", "scripted"] = Field(
        "hf",
        description="'hf': the policy samples through Hugging Face generate; 'vllm': through a vLLM rollout server "
        "(`make install-vllm`; see rollout.vllm); 'scripted': a Python policy.",
    )
    vllm: VLLMConfig = Field(default_factory=lambda: VLLMConfig(), description="The vLLM server (backend='vllm').")
    scripted_policy: str = Field("random", description="Scripted policy name when backend='scripted'.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of training rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling; 1.0 keeps the sampler's log-probs exact.")
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables it.")
    max_new_tokens: Annotated[int, Field(gt=0, le=MAX_NEW_TOKENS)] = Field(
        48, description="Maximum tokens of one reply (paper scale: 400)."
    )
    enable_think: bool = Field(True, description="Ask for and parse <think>...</think> before <answer>.")
    think_prefix: bool = Field(
        True,
        description="With enable_think: end every prompt with <think> after the assistant header, so the model "
        "continues from inside the thinking block (RAGEN's prompts); the prefix is not trained.",
    )
    prompt_style: Literal["full", "compact"] = Field(
        "full",
        description="'full': RAGEN's prompts (system message, rules and symbol legend, a format reminder every turn). "
        "'compact': no system message, the env's one-line rule, the actions, the state and the budget (about a "
        "quarter of the text; what a small randomly initialised model can learn to read, docs/findings.md).",
    )
    format_penalty: float = Field(-0.1, le=0, description="Added once per turn whose reply breaks the format.")
    context_window_mode: Literal["full", "limited_multi_turn", "single_turn"] = Field(
        "full",
        description="What the model sees at each turn (RAGEN-2's context_window_mode). 'full': the whole chat so far "
        "(one training sequence per trajectory). 'limited_multi_turn': the system and first message, then the last "
        "max_context_window turns as chat turns. 'single_turn': one user message holding the last "
        "max_context_window - 1 turns as text, then the current turn. The windowed modes train each turn's reply "
        "in the exact window it was sampled in (the turn sequences are packed into the trajectory's row).",
    )
    max_context_window: PositiveInt | None = Field(
        None,
        description="Turns in the window, the current one included (1: only the current turn); required by "
        "limited_multi_turn and single_turn, unused by full.",
    )
    training_rows: Literal["trajectory", "turn"] = Field(
        "trajectory",
        description="Windowed modes: the update's rows. 'trajectory': one row per trajectory packing its turns' "
        "sequences; 'turn': every turn is its own row carrying the trajectory's score (RAGEN-2's samples in its "
        "context-window modes), so the loss aggregation and mini-batches count turns; GRPO and the filter still "
        "count each trajectory once. 'full' mode: trajectory only.",
    )

    @model_validator(mode="after")
    def _check_window(self) -> RolloutConfig:
        if self.context_window_mode == "full" and self.max_context_window is not None:
            raise ValueError(
                "rollout.max_context_window only applies to windowed modes: set rollout.context_window_mode to "
                "limited_multi_turn or single_turn, or drop rollout.max_context_window"
            )
        if self.context_window_mode != "full" and self.max_context_window is None:
            raise ValueError(
                f"rollout.context_window_mode={self.context_window_mode} needs rollout.max_context_window (the "
                "number of turns the model sees, the current one included, >= 1)"
            )
        if self.context_window_mode == "full" and self.training_rows == "turn":
            raise ValueError(
                "rollout.training_rows=turn cuts the windowed rows into their turns' sequences; in full mode a "
                "trajectory is one sequence: set rollout.context_window_mode to limited_multi_turn or single_turn "
                "(RAGEN-2 trains turn rows only there), or rollout.training_rows=trajectory"
            )
        return self


class AlgorithmConfig(_Section):
    """StarPO / StarPO-S settings. Keys left out take the preset's value; keys given override it."""

    preset: Literal["starpo", "starpo_s", "ragen2"] = Field(
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
    clip_low: NonNegativeFloat = Field(description="PPO clip below 1 (ratio >= 1 - clip_low).")
    clip_high: NonNegativeFloat = Field(description="PPO clip above 1 (ratio <= 1 + clip_high); StarPO-S: 0.28.")
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound for negative advantages (dual_clip loss).")
    kl_coef: NonNegativeFloat = Field(description="KL coefficient to the frozen initial policy; 0 = off.")
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="Apply KL as a loss term (RAGEN's default) or subtract it from the token rewards."
    )
    kl_estimator: Literal["k1", "k2", "k3", "kl", "mse", "low_var_kl", "abs"] = Field(
        "k1", description="KL estimator: k1 (kl, RAGEN's), k2 (mse), k3 (low_var_kl) or abs."
    )
    entropy_coef: NonNegativeFloat = Field(0.001, description="Entropy bonus coefficient.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = Field(
        "seq-mean-token-mean",
        description="Loss reduction: seq-mean-token-mean (each trajectory's token mean, averaged over trajectories: "
        "the paper's equation and what RAGEN's code computes with one trajectory per micro-batch), token-mean (over "
        "all tokens of the mini-batch) or seq-mean-token-sum.",
    )
    filter: str = Field(
        "std",
        description="Group-selection strategy (RAGEN-2's rollout filter): top_k (keep the first filter_ratio share "
        "of groups by filter_metric), top_k_abs (keep filter_ratio groups), top_p (nucleus over the metric, see "
        "filter_top_p_mode) or min_p (keep groups within a factor filter_ratio of the best). Aliases: std = top_k, "
        "std_rev = top_k keeping the smallest, std_top_p = top_p linear (all three over reward_std).",
    )
    filter_ratio: float = Field(
        gt=0,
        description="The strategy's value: top_k share of groups kept, top_p mass, min_p factor (all in (0, 1]; "
        "1.0 keeps everything under top_k and top_p); top_k_abs: number of groups kept (a whole number >= 1).",
    )
    filter_metric: Literal["reward_std", "reward", "reward_sum", "entropy", "entropy_variance", "length"] = Field(
        "reward_std",
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
        None, description="Keep the groups with the largest metric (true) or the smallest (false); None: largest "
        "(std_rev: smallest).",
    )  # fmt: skip
    filter_include_zero: bool = Field(
        True,
        description="Whether groups whose ranked value is zero (|value| <= 1e-10; for reward_std: rewards that do "
        "not vary; for reward: a zero mean) may be kept, as RAGEN-2's rollout_filter_include_zero.",
    )
    filter_top_p_mode: Literal["linear", "softmax"] = Field(
        "linear",
        description="top_p: 'linear' keeps the shortest prefix whose metric sum reaches filter_ratio of the total "
        "minus filter_eps (nothing if it cannot); 'softmax' the shortest prefix whose softmax mass reaches it.",
    )
    filter_eps: NonNegativeFloat = Field(
        0.01, description="top_p linear: slack subtracted from the target sum (RAGEN's selection epsilon)."
    )
    filter_loss_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none",
        description="RAGEN-2's filter_loss_scaling: multiply every advantage by the share of groups the filter kept "
        "('linear') or its square root ('sqrt'), so a heavily filtered batch takes a smaller step; 'none': unscaled.",
    )
    filter_empty_stop_steps: NonNegativeInt = Field(
        5,
        description="RAGEN-2's rollout_filter_empty_stop_steps: stop training after this many consecutive training "
        "iterations whose filter kept no group (then the final validation runs); 0: never stop.",
    )
    soft_advantage_reweight: bool = Field(
        False,
        description="RAGEN-2's soft advantage reweighting (grpo only): multiply each kept trajectory's advantage by "
        "its group's reward std over the largest kept group's (std / (max std + 1e-6)), down-weighting low-variance "
        "groups instead of dropping them.",
    )

    @property
    def needs_critic(self) -> bool:
        """Whether the estimator needs a value model: it takes the critic's ``values`` (an unknown estimator is
        refused elsewhere, naming the registered ones)."""
        from ragen_core.algos import ADVANTAGES
        from ragen_core.registry import keyword_parameters

        name = self.adv_estimator
        return name in ADVANTAGES and "values" in keyword_parameters(ADVANTAGES.get(name))

    @property
    def filter_spec(self) -> FilterSpec:
        """The resolved group filter (aliases expanded)."""
        from ragen_core.algos.filters import resolve_filter

        return resolve_filter(
            self.filter,
            value=self.filter_ratio,
            metric=self.filter_metric,
            largest=self.filter_largest if self.filter_largest is not None else self.filter != "std_rev",
            include_zero=self.filter_include_zero,
            top_p_mode=self.filter_top_p_mode,
            eps=self.filter_eps,
        )

    @model_validator(mode="after")
    def _check_filter(self) -> AlgorithmConfig:
        from ragen_core.algos.filters import check_filter_options

        check_filter_options(
            self.filter, self.filter_ratio, self.filter_metric, self.filter_largest, self.filter_top_p_mode
        )
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


# What each preset sets (the RAGEN paper): StarPO-S = decoupled clip, no KL, variance filter keeping 25% of groups.
# ragen2: RAGEN-2's recommended setting (its README's SNR-adaptive filtering and filtering runs): StarPO-S's clip and
# KL, the top-p filter over reward std at 0.9 with linear mass, groups without reward variance excluded.
PRESETS: dict[str, dict[str, Any]] = {
    "starpo": {"clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.001, "filter_ratio": 1.0},
    "starpo_s": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "filter_ratio": 0.25},
    "ragen2": {
        "clip_low": 0.2,
        "clip_high": 0.28,
        "kl_coef": 0.0,
        "filter": "top_p",
        "filter_ratio": 0.9,
        "filter_metric": "reward_std",
        "filter_top_p_mode": "linear",
        "filter_include_zero": False,
    },
}


class ActorConfig(_Section):
    """Optimisation of the policy (DeepSpeed engine)."""

    lr: float = Field(1e-3, gt=0, description="Learning rate (paper, 0.5B pretrained: 1e-6; tiny model needs more).")
    weight_decay: NonNegativeFloat = Field(0.01, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    mini_batch_size: PositiveInt = Field(32, description="Trajectories per optimizer step (RAGEN: 32).")
    micro_batch_size: PositiveInt = Field(16, description="Trajectories per forward/backward pass.")
    ppo_epochs: PositiveInt = Field(1, description="Passes over the kept batch per iteration.")
    online_k: PositiveInt | None = Field(
        None,
        description="Online-k: exactly k optimizer steps of mini_batch_size trajectories per rollout batch (cycling "
        "through reshuffled passes over the kept batch). None: ppo_epochs full passes.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        0,
        description="DeepSpeed ZeRO stage: 0 (plain data parallelism), 1 (optimizer states sharded), 2 (+ gradients) "
        "or 3 (+ weights; launched groups only). A group of several processes needs 1-3.",
    )
    reuse_behavior_logprobs: Literal["auto", "always", "never"] = Field(
        "auto",
        description="PPO's old log-probs: 'auto' takes the sampler's stored behaviour log-probs when they are exactly "
        "the policy's (rollout.backend=hf, temperature 1, no top-k/top-p, fp32, only policy rows) and re-scores "
        "otherwise; 'always' takes them whenever the rows have them; 'never' re-scores the batch (one more forward).",
    )


class CriticConfig(_Section):
    """The value model, used when the advantage estimator needs one (gae, bi_level_gae)."""

    lr: float = Field(
        1e-3, gt=0, description="Learning rate (paper, 0.5B pretrained: 1e-5; the tiny random model needs more)."
    )
    weight_decay: NonNegativeFloat = Field(0.01, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    cliprange_value: float = Field(0.5, gt=0, description="Clip of the value update around the old values.")
    path: str | None = Field(None, description="Model dir of the critic's backbone; None: the policy's start model.")
    mini_batch_size: PositiveInt | None = Field(None, description="None: actor.mini_batch_size.")
    micro_batch_size: PositiveInt | None = Field(None, description="None: actor.micro_batch_size.")
    ppo_epochs: PositiveInt | None = Field(None, description="None: actor.ppo_epochs.")


class OfflineConfig(_Section):
    """Offline re-training from stored trajectories (``ragen retrain``)."""

    epochs: PositiveInt = Field(1, description="Passes over the selected trajectories.")
    batch_size: PositiveInt = Field(
        32, description="SFT: trajectories per optimizer step (pg: actor.mini_batch_size)."
    )
    is_bound: float | None = Field(
        3.0,
        gt=1,
        description="pg: bound on the importance weight pi/mu for negative advantages (dual clip); positive ones are "
        "bounded by clip_high. None: plain PPO clipping.",
    )


class MonitorConfig(_Section):
    """Echo-Trap early warnings: events recorded (and logged) while the run goes on."""

    warmup: NonNegativeInt = Field(2, description="Iterations observed before any warning.")
    reward_std_drop: float = Field(
        0.5, gt=0, le=1, description="Warn when in-group reward std falls this fraction below its running peak."
    )
    entropy_drop: float = Field(
        0.5, gt=0, le=1, description="Warn when token entropy falls this fraction below its running peak."
    )
    grad_norm_spike: float = Field(
        5.0, gt=1, description="Warn when the gradient norm exceeds this multiple of its running median."
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


class TrainerConfig(_Section):
    """The iteration loop."""

    iterations: PositiveInt = Field(20, description="Number of StarPO iterations (policy updates).")
    num_threads: PositiveInt | None = Field(None, description="torch intra-op threads; None: torch's default.")
    checkpoint_every: PositiveInt = Field(
        1, description="Save the engines (and a Hugging Face export) every N updates, and after the last one."
    )
    keep_last: PositiveInt = Field(2, description="Checkpoints kept per run (older ones are deleted).")
    launcher: Literal["inprocess", "torchrun", "deepspeed"] = Field(
        "inprocess",
        description="Where the update stage runs: 'inprocess' (the run's own process, the default), or a long-lived "
        "group of processes started once per run by 'torchrun' or the 'deepspeed' launcher (data-parallel over "
        "trainer.nproc processes per node, ZeRO from actor.zero_stage); the run's process keeps the rollouts.",
    )
    nproc: PositiveInt = Field(
        1, description="Processes of the launched update group per node (one per GPU); needs a launcher if > 1."
    )
    hostfile: str | None = Field(
        None,
        description="DeepSpeed hostfile ('host slots=N' lines) to span several nodes (launcher=deepspeed only); start "
        "the run on the first host, with the data root on a filesystem every host mounts at the same path.",
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Engine and rollout precision: 'auto' = bf16 on a bf16-capable CUDA GPU, else fp32; bf16 and "
        "fp16 (dynamic loss scaling) need CUDA. The resolved precision is recorded in the run manifest.",
    )
    mi_diagnostic: bool = Field(
        False,
        description="Template-collapse diagnostic: before each update, score every training trajectory's first-turn "
        "reasoning under its own prompt and under trainer.mi_prompts - 1 other prompts of the batch with the current "
        "policy, and store the mutual-information estimates diag/reasoning_mi_per_token (RAGEN-2's headline) and "
        "diag/reasoning_mi (summed) (cost: N x mi_prompts forward sequences; docs/algorithms.md).",
    )
    mi_prompts: int = Field(
        8, ge=2, description="Prompts each reasoning is scored under (its own + mi_prompts - 1 others), at most."
    )
    mi_reasoning: Literal["content", "block"] = Field(
        "content",
        description="The reasoning Z: 'content' (RAGEN-2's) is the text inside <think>...</think> only, and replies "
        "without a closed think block are left out (with rollout.enable_think=false there is none); 'block' is the "
        "block through </think>, or the whole reply when it has no </think> (this project's earlier span).",
    )
    mi_multi_turn: bool = Field(
        False,
        description="Also estimate RAGEN-2's multi-turn sampled variant (diag/reasoning_mt_*): (prompt, reasoning) "
        "pairs of every turn, drawn uniformly over trajectories then over their turns, each draw its own prompt "
        "(needs rollout.context_window_mode=full, as RAGEN-2).",
    )
    mi_samples: PositiveInt | None = Field(
        None,
        description="Multi-turn variant: draws (RAGEN-2's collapse_detection.num_samples); None: as many as the "
        "batch's turns with a reasoning. Each is scored under min(mi_prompts, draws) prompts.",
    )

    @model_validator(mode="after")
    def _check_launcher(self) -> TrainerConfig:
        if self.nproc > 1 and self.launcher == "inprocess":
            raise ValueError(
                f"trainer.nproc={self.nproc} needs a launched group: set trainer.launcher=torchrun or deepspeed"
            )
        if self.hostfile is not None and self.launcher != "deepspeed":
            raise ValueError("trainer.hostfile needs the DeepSpeed launcher: set trainer.launcher=deepspeed")
        # whether the machine can run the precision is not the config's business (a CPU head node plans bf16 runs):
        # the commands check it before they start (ragen_core.training.precision.resolve_precision)
        return self


class EvalConfig(_Section):
    """Validation on fixed instances."""

    every: PositiveInt = Field(5, description="Validate every N iterations; iteration 0 = before any update.")
    instances: PositiveInt = Field(256, description="Fixed validation instances per environment.")
    k: PositiveInt = Field(1, description="Samples per instance; pass@k counts an instance solved if any succeeds.")
    temperature: float = Field(0.5, gt=0, description="Validation sampling temperature.")
    seed: int = Field(123, description="Seed of the fixed validation instances (shared by all runs).")


class BootstrapConfig(_Section):
    """Supervised warm-start on scripted demonstrations before RL (teaches the tiny model the reply format)."""

    enabled: bool = Field(False, description="Run the bootstrap before the first iteration.")
    policy: str = Field("random", description="Scripted policy that writes the demonstrations.")
    num_groups: PositiveInt = Field(64, description="Demonstration env instances.")
    group_size: PositiveInt = Field(8, description="Demonstrations per instance.")
    epochs: PositiveInt = Field(3, description="Passes over the demonstrations.")
    lr: float = Field(3e-3, gt=0, description="Supervised learning rate.")
    batch_size: PositiveInt = Field(32, description="Demonstrations per optimizer step.")
    teacher_prob: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="The teacher_mix policy's probability of the teacher's move (else a random valid move), for the "
        "bootstrap and for rollout.scripted_policy=teacher_mix: the strength of the weak prior it teaches.",
    )
    seed: int | None = Field(
        None,
        description="Seed of the demonstrations and their SFT; None: the run's seed. Set it to start runs of "
        "different seeds from one bootstrapped model (built once, cached), as RL seeds of one base model.",
    )


class RunConfig(_Section):
    """The whole run."""

    seed: int = Field(0, description="Run seed; everything random derives from it.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    offline: OfflineConfig = Field(default_factory=OfflineConfig)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> RunConfig:
        _check_registered_names(self)
        if self.actor.mini_batch_size % self.actor.micro_batch_size:
            raise ValueError(
                f"actor.mini_batch_size={self.actor.mini_batch_size} must be a multiple of "
                f"actor.micro_batch_size={self.actor.micro_batch_size}"
            )
        critic_mini = self.critic.mini_batch_size or self.actor.mini_batch_size
        critic_micro = self.critic.micro_batch_size or self.actor.micro_batch_size
        if self.algorithm.needs_critic and critic_mini % critic_micro:
            raise ValueError(
                f"critic.mini_batch_size={critic_mini} must be a multiple of critic.micro_batch_size={critic_micro}"
            )
        _check_scale_out(self)
        algorithm = self.algorithm
        entropy_metric = algorithm.filter_metric in ("entropy", "entropy_variance")
        sampled_entropy = entropy_metric and algorithm.filter_entropy == "sampled"
        if sampled_entropy and self.rollout.backend == "scripted":
            raise ValueError(
                f"algorithm.filter_metric={algorithm.filter_metric} with filter_entropy=sampled needs behaviour "
                "log-probs, which scripted rollouts (rollout.backend=scripted) do not have: set "
                "algorithm.filter_entropy=full (the policy scores the rows) or choose a reward or length metric"
            )
        if self.actor.reuse_behavior_logprobs == "always" and self.rollout.backend == "scripted":
            raise ValueError(
                "actor.reuse_behavior_logprobs=always needs behaviour log-probs, which scripted rollouts "
                "(rollout.backend=scripted) do not have: use auto or never"
            )
        _check_mi(self)
        if self.rollout.training_rows == "turn" and algorithm.reward_level == "turn":
            raise ValueError(
                "rollout.training_rows=turn gives every turn row its trajectory's score (RAGEN-2); "
                "algorithm.reward_level=turn would need each turn's own reward: use reward_level=trajectory with "
                "turn rows, or training_rows=trajectory"
            )
        if self.env.max_actions_per_turn > self.env.max_actions_per_traj:
            raise ValueError(
                f"env.max_actions_per_turn={self.env.max_actions_per_turn} exceeds env.max_actions_per_traj="
                f"{self.env.max_actions_per_traj}; set it at most the trajectory budget"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """The resolved tree as plain JSON-compatible values."""
        return self.model_dump(mode="json")

    def config_hash(self) -> str:
        """Stable 16-hex-digit digest of the resolved config (sorted-key JSON)."""
        payload = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _check_mi(config: RunConfig) -> None:
    """The MI diagnostic's keys must fit together (checked at load time)."""
    trainer = config.trainer
    if trainer.mi_multi_turn and not trainer.mi_diagnostic:
        raise ValueError("trainer.mi_multi_turn is part of the MI diagnostic: set trainer.mi_diagnostic=true too")
    if trainer.mi_samples is not None and not trainer.mi_multi_turn:
        raise ValueError("trainer.mi_samples sets the multi-turn sample's draws: set trainer.mi_multi_turn=true")
    if trainer.mi_multi_turn and config.rollout.context_window_mode != "full":
        raise ValueError(
            "trainer.mi_multi_turn scores each turn under the chat before it, which windowed rollouts "
            f"(rollout.context_window_mode={config.rollout.context_window_mode}) do not keep: use full (RAGEN-2 "
            "computes no collapse metric outside full)"
        )


def _check_scale_out(config: RunConfig) -> None:
    """Launcher, processes and ZeRO stage must fit together (checked at load time)."""
    trainer, stage = config.trainer, config.actor.zero_stage
    if stage == 3 and trainer.launcher == "inprocess":
        raise ValueError(
            "actor.zero_stage=3 shards the weights over the processes of a launched group (and would slow every "
            "in-process generation): set trainer.launcher=torchrun or deepspeed, or use actor.zero_stage 0-2"
        )
    if (trainer.nproc > 1 or trainer.hostfile) and stage == 0:
        raise ValueError(
            "a data-parallel update over several processes needs actor.zero_stage 1, 2 or 3 (ZeRO-0 would log only "
            "one rank's gradient norm)"
        )


def _check_registered_names(config: RunConfig) -> None:
    """Names that refer to registries must exist there (checked at load time, before any compute)."""
    from ragen_core.algos import ADVANTAGES, POLICY_LOSSES
    from ragen_core.envs import registered_envs
    from ragen_core.rollout.scripted import registered_scripted_policies

    envs = registered_envs()
    for key, name in [("env.name", config.env.name)] + [("env.val_envs", n) for n in config.env.val_envs or []]:
        if name not in envs:
            raise ValueError(f"{key}: unknown environment {name!r}; registered: {', '.join(envs)}")
    for key, name, registry in (
        ("algorithm.adv_estimator", config.algorithm.adv_estimator, ADVANTAGES),
        ("algorithm.policy_loss", config.algorithm.policy_loss, POLICY_LOSSES),
    ):
        if name not in registry:
            raise ValueError(f"{key}: unknown name {name!r}; registered: {', '.join(registry.names())}")
    policies = registered_scripted_policies()
    for key, name in (
        ("rollout.scripted_policy", config.rollout.scripted_policy),
        ("bootstrap.policy", config.bootstrap.policy),
    ):
        if name not in policies:
            raise ValueError(f"{key}: unknown scripted policy {name!r}; registered: {', '.join(policies)}")
        if name == "describe_random":
            _check_describing_policy(config, key)
        if name == "teacher_mix":
            _check_teacher_policy(config, key)


def _check_teacher_policy(config: RunConfig, key: str) -> None:
    """``teacher_mix`` draws the teacher's moves: every env it plays must have a teacher."""
    from ragen_core.envs import make_env
    from ragen_core.rollout.scripted import has_teacher

    for name in {config.env.name, *(config.env.val_envs or [])} if key.startswith("rollout") else {config.env.name}:
        if not has_teacher(make_env(name)):
            raise ValueError(
                f"{key}: teacher_mix draws the teacher's moves, and {name} has no teacher (frozen_lake and sokoban "
                "have one); use the random policy"
            )


def _check_describing_policy(config: RunConfig, key: str) -> None:
    """``describe_random`` writes the env's state descriptions as thinking: the env must have some, replies think."""
    from ragen_core.envs import TextEnv, make_env

    env_type = type(make_env(config.env.name))
    if env_type.describe is TextEnv.describe:
        raise ValueError(
            f"{key}: describe_random writes the env's state descriptions, and {config.env.name} has none "
            "(frozen_lake has them); use the random policy"
        )
    if not config.rollout.enable_think:
        raise ValueError(f"{key}: describe_random writes its descriptions as thinking: set rollout.enable_think=true")


def _format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; see README 'Configs' for the keys)"
        elif item["type"] == "missing":
            message = "required"
        lines.append(f"  {key}: {message}")
    return "invalid config:\n" + "\n".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' merges may override, as YAML allows
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one section (lines {first} and {line}); keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


YAML_MAX_BYTES = 1_000_000  # a config is a few kilobytes; a megabyte is room for long env options
YAML_MAX_DEPTH = 64  # sections nest a few levels: deeper is a mistake (and would exhaust Python's recursion)
YAML_MAX_NODES = 100_000  # values after expanding aliases: an alias bomb (billion laughs) is refused, not expanded


def _yaml_bounds(text: str, what: str) -> None:
    """Refuse YAML whose nesting or alias-expanded size exceed the limits, from its parse events, before any object
    is built (the parser keeps its own stack, so a 20,000-deep text costs no recursion here)."""
    sizes: dict[str, int] = {}  # anchor -> expanded size of its node
    open_nodes: list[list[Any]] = []  # [size so far, anchor] of each collection being read
    total = 0

    def add(size: int) -> None:
        nonlocal total
        total += size
        if total > YAML_MAX_NODES:
            raise ConfigError(
                f"{what} expands to more than {YAML_MAX_NODES:,} values (aliases included): a config never needs "
                "that many; remove the repeated aliases (*name)"
            )
        if open_nodes:
            open_nodes[-1][0] += size

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(open_nodes) >= YAML_MAX_DEPTH:
                raise ConfigError(f"{what} nests deeper than {YAML_MAX_DEPTH} levels; configs nest a few sections")
            add(1)  # the collection itself, counted in its parent
            open_nodes.append([0, event.anchor])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            size, anchor = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = size + 1
        elif isinstance(event, yaml.ScalarEvent):
            add(1)
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            add(sizes.get(event.anchor, 1))


def load_yaml(text: str, what: str) -> Any:
    """Parse YAML ``text`` (``what`` names it in errors, e.g. ``config file 'x.yaml'``) with a safe loader that builds
    no objects, refuses a key given twice, and is bounded (:data:`YAML_MAX_DEPTH`, :data:`YAML_MAX_NODES`) before
    anything is built; every problem is a one-line :class:`ConfigError`."""
    try:
        _yaml_bounds(text, what)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: builds no objects
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError(f"{what} is not valid YAML: {problem}") from exc


def read_yaml_file(path: Path) -> Any:
    """The YAML of a config file: a text file of at most :data:`YAML_MAX_BYTES`, UTF-8, parsed by
    :func:`load_yaml`."""
    what = f"config file {str(path)!r}"
    try:
        size = path.stat().st_size
        if size > YAML_MAX_BYTES:
            raise ConfigError(f"{what} is {size:,} bytes; a config is YAML text of at most {YAML_MAX_BYTES:,} bytes")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 at byte {exc.start}"
        raise ConfigError(f"{what} is not a YAML text file ({problem}); give a .yaml config") from exc
    if "\x00" in text:
        raise ConfigError(f"{what} is not a YAML text file (it holds NUL bytes); give a .yaml config")
    return load_yaml(text, what)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value (e.g. rollout.group_size=8)")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ConfigError(f"override {text!r} has an empty key")
    shown = text if len(text) <= 80 else text[:60] + "..."
    value = load_yaml(raw, f"the value of override {shown!r}") if raw.strip() else ""
    return path, value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``tree`` with each ``key.sub=value`` override set (intermediate sections created). A key set
    twice (``a.b=1 a.b=2``, or ``a.b=1`` beside ``a={b: 2}``) is an error: which one was meant is unknowable."""
    result = copy.deepcopy(tree)
    given: dict[tuple[str, ...], str] = {}
    for text in overrides:
        path, value = parse_override(text)
        for earlier_path, earlier in given.items():
            shorter = min(len(path), len(earlier_path))
            if tuple(path[:shorter]) == earlier_path[:shorter]:
                raise ConfigError(
                    f"overrides {earlier!r} and {text!r} both set {'.'.join(path[:shorter])}; give it once"
                )
        given[tuple(path)] = text
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return result


# Keys added after runs were stored whose default is not how those runs behaved: a stored config that lacks one of
# them behaved as the value here (RAGEN's <think> prefix came with rollout.think_prefix; earlier prompts had none).
# Old runs re-scored their old log-probs (actor.reuse_behavior_logprobs came later): replaying them so keeps their
# updates bit for bit.
# Runs stored before RAGEN-2's MI span and headline took the think block (or the whole reply) and warned on the summed
# estimate. Runs stored before algorithm.filter_empty_stop_steps never stopped early.
STORED_CONFIG_FALLBACKS: dict[str, Any] = {
    "rollout.think_prefix": False,
    "actor.reuse_behavior_logprobs": "never",
    "trainer.mi_reasoning": "block",
    "monitor.mi_metric": "sequence",
    "monitor.success_slip": None,
    "algorithm.filter_empty_stop_steps": 0,
}


def stored_config(tree: dict[str, Any]) -> dict[str, Any]:
    """A run's stored config tree (its manifest's ``config``) with the keys it predates filled in as the run behaved
    (:data:`STORED_CONFIG_FALLBACKS`); use it wherever a run's own config is read back (resume, evaluation)."""
    filled = copy.deepcopy(tree)
    for dotted, value in STORED_CONFIG_FALLBACKS.items():
        section, key = dotted.split(".")
        part = filled.setdefault(section, {})
        if isinstance(part, dict):
            part.setdefault(key, value)
    return filled


def build_config(tree: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Validate a config tree (plus overrides) into a frozen :class:`RunConfig`; raise :class:`ConfigError`."""
    merged = apply_overrides(tree or {}, overrides or [])
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config file (or the defaults when ``path`` is None) and apply ``key.sub=value`` overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        loaded = read_yaml_file(path)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {str(path)!r} must hold a mapping of sections, got {type(loaded).__name__}"
            )
        tree = loaded or {}
    return build_config(tree, overrides)
