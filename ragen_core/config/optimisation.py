"""The sections of how a run learns: the actor, the critic, offline re-training, the iteration loop, the
bootstrap."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from ragen_core.config.base import MAX_COUNT, MAX_SCALE, LearningRate, PositiveInt, Scale, Section, Seed
from ragen_core.config.trust import trusted_only

# vLLM serves adapters on the attention and MLP projections only, and a LoRA on a head tied to the embedding (the
# tiny model's) would change the embedding too
LORA_REFUSED_MODULES = ("lm_head", "embed_tokens")


class LoraConfig(Section):
    """LoRA adapters on the policy (PEFT): the start model frozen as the base, only the adapters trained."""

    rank: int = Field(
        ..., gt=0, le=512, description="Rank r of every adapter (required: actor.lora.rank=8 alone turns LoRA on)."
    )
    alpha: PositiveInt = Field(16, description="Scale numerator: an adapter adds (alpha / rank) * B A x.")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input in training passes (0: none; > 0 is reseeded per update, so a "
        "resume stays exact).",
    )
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="The linear layers that get an adapter: 'all-linear' (every linear layer but the output head) or "
        "names of layers (a name matches every layer whose dotted path ends with it, e.g. [q_proj, v_proj]).",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _linear_layers_only(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "all-linear":
            raise ValueError(f"{value!r} is neither 'all-linear' nor a list of layer names (e.g. [q_proj, v_proj])")
        if isinstance(value, list) and not value:
            raise ValueError("an empty list adapts nothing: name layers (e.g. [q_proj, v_proj]) or use 'all-linear'")
        for name in value if isinstance(value, list) else []:
            if not isinstance(name, str) or not name.strip(". ") or name.split(".")[-1] in LORA_REFUSED_MODULES:
                raise ValueError(
                    f"{name!r} is no layer an adapter may go on: name linear projections such as q_proj or "
                    f"down_proj (never {' or '.join(LORA_REFUSED_MODULES)}), or use 'all-linear'"
                )
        return value


class ActorConfig(Section):
    """Optimisation of the policy (DeepSpeed engine)."""

    lr: LearningRate = Field(1e-3, description="Learning rate (paper, 0.5B pretrained: 1e-6; tiny model needs more).")
    weight_decay: Scale = Field(0.01, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=MAX_SCALE, description="Global gradient-norm clip.")
    mini_batch_size: PositiveInt = Field(32, description="Trajectories per optimizer step (RAGEN: 32).")
    micro_batch_size: PositiveInt = Field(
        16,
        description="Trajectories per forward/backward pass; with micro_batch_tokens, the most a pass takes (set it "
        "to mini_batch_size to let the token budget alone decide).",
    )
    micro_batch_tokens: PositiveInt | None = Field(
        8192,
        description="Token budget of one forward/backward pass (as verl's ppo_max_token_len_per_gpu): each "
        "mini-batch's rows are sorted by length and cut into passes of at most this many padded tokens (rows x "
        "longest row; a longer row is a pass alone) and at most micro_batch_size rows, so rows of like length share "
        "a pass and little of it is padding. Loss normalisers stay the whole mini-batch's. None: passes of "
        "micro_batch_size rows in schedule order.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in the backward pass: less memory for long sequences, ~1/3 more "
        "compute (transformers' non-reentrant checkpointing).",
    )
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = Field(
        "auto",
        description="Attention kernel of the engines' models: 'auto' = flash_attention_2 on CUDA when the flash-attn "
        "package is installed, else sdpa (torch's fused scaled-dot-product attention); 'eager' is the plain one.",
    )
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
    lora: LoraConfig | None = Field(
        None,
        description="Train LoRA adapters on the frozen start model instead of every weight (docs/lora.md): the KL "
        "reference is the policy with its adapters off, checkpoints hold the adapters. null (default): full "
        "fine-tuning, and out of the config hash.",
    )


class CriticConfig(Section):
    """The value model, used when the advantage estimator needs one (gae, bi_level_gae)."""

    lr: LearningRate = Field(
        1e-3, description="Learning rate (paper, 0.5B pretrained: 1e-5; the tiny random model needs more)."
    )
    weight_decay: Scale = Field(0.01, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=MAX_SCALE, description="Global gradient-norm clip.")
    cliprange_value: float = Field(
        0.5, gt=0, le=MAX_SCALE, description="Clip of the value update around the old values."
    )
    path: str | None = Field(
        None,
        description="Model dir of the critic's backbone; None: the policy's start model.",
        json_schema_extra=trusted_only("path"),
    )
    mini_batch_size: PositiveInt | None = Field(None, description="None: actor.mini_batch_size.")
    micro_batch_size: PositiveInt | None = Field(None, description="None: actor.micro_batch_size.")
    ppo_epochs: PositiveInt | None = Field(None, description="None: actor.ppo_epochs.")


class OfflineConfig(Section):
    """Offline re-training from stored trajectories (``ragen retrain``)."""

    epochs: PositiveInt = Field(1, description="Passes over the selected trajectories.")
    batch_size: PositiveInt = Field(
        32, description="SFT: trajectories per optimizer step (pg: actor.mini_batch_size)."
    )
    is_bound: float | None = Field(
        3.0,
        gt=1,
        le=MAX_SCALE,
        description="pg: bound on the importance weight pi/mu for negative advantages (dual clip); positive ones are "
        "bounded by clip_high. None: plain PPO clipping.",
    )


_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]")


def rendezvous_address(endpoint: str) -> tuple[str, int]:
    """The host and port of ``trainer.rdzv_endpoint`` (``HOST:PORT``, an IPv6 address in brackets); ValueError
    naming the expected form otherwise."""
    host, _, port = endpoint.rpartition(":")
    if not _HOST.fullmatch(host) or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise ValueError(
            f"rendezvous endpoint {endpoint!r} is not HOST:PORT: give node 0's host name or address and a free port "
            "1-65535, e.g. node0.cluster:29400 or [fd00::1]:29400"
        )
    return host.strip("[]"), int(port)


class TrainerConfig(Section):
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
        json_schema_extra=trusted_only("launcher"),
    )
    nproc: PositiveInt = Field(
        1, description="Processes of the launched update group per node (one per GPU); needs a launcher if > 1."
    )
    nnodes: PositiveInt = Field(
        1,
        le=MAX_COUNT,
        description="Nodes of the launched update group (launcher=torchrun): this run's host is node 0 and starts "
        "its trainer.nproc ranks; each other node joins with `ragen group join` (docs/cluster.md). Ranks are fixed by "
        "node (node r holds ranks r*nproc .. r*nproc+nproc-1), so the update equals one node's with as many ranks.",
    )
    rdzv_endpoint: str | None = Field(
        None,
        description="HOST:PORT where the other nodes meet node 0 (torchrun's static rendezvous: node 0 listens on "
        "PORT, the others connect to HOST:PORT); needed when trainer.nnodes > 1. Reach it only from the cluster's "
        "network.",
        json_schema_extra=trusted_only("rendezvous"),
    )
    hostfile: str | None = Field(
        None,
        description="DeepSpeed hostfile ('host slots=N' lines) to span several nodes (launcher=deepspeed only); start "
        "the run on the first host, with the data root on a filesystem every host mounts at the same path.",
        json_schema_extra=trusted_only("hostfile"),
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Engine and rollout precision: 'auto' = bf16 on a bf16-capable CUDA GPU, else fp32; bf16 and "
        "fp16 (dynamic loss scaling) need CUDA. The resolved precision is recorded in the run manifest.",
    )
    max_staleness: NonNegativeInt = Field(
        0,
        le=MAX_COUNT,
        description="Asynchronous StarPO: 0 runs each iteration's stages one after another (synchronous); k >= 1 "
        "samples iteration i's batch with the policy after update i - k (the first k batches with the start policy) "
        "in a sampler of its own while the learner updates, so generation and update overlap. Which policy samples "
        "which batch is fixed by this schedule, never by timing: an async run is as deterministic as a synchronous "
        "one and resumes exactly. trajectories.policy_version records each batch's policy (docs/async.md).",
    )
    mi_diagnostic: bool = Field(
        False,
        description="Template-collapse diagnostic: before each update, score every training trajectory's first-turn "
        "reasoning under its own prompt and under trainer.mi_prompts - 1 other prompts of the batch with the current "
        "policy, and store the mutual-information estimates diag/reasoning_mi_per_token (RAGEN-2's headline) and "
        "diag/reasoning_mi (summed) (cost: N x mi_prompts forward sequences; docs/algorithms.md).",
    )
    mi_prompts: int = Field(
        8,
        ge=2,
        le=MAX_COUNT,
        description="Prompts each reasoning is scored under (its own + mi_prompts - 1 others), at most.",
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

    @field_validator("rdzv_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            rendezvous_address(value)
        return value

    @model_validator(mode="after")
    def _check_launcher(self) -> TrainerConfig:
        if self.nproc > 1 and self.launcher == "inprocess":
            raise ValueError(
                f"trainer.nproc={self.nproc} needs a launched group: set trainer.launcher=torchrun or deepspeed"
            )
        if self.hostfile is not None and self.launcher != "deepspeed":
            raise ValueError("trainer.hostfile needs the DeepSpeed launcher: set trainer.launcher=deepspeed")
        if self.nnodes > 1 and self.launcher != "torchrun":
            raise ValueError(
                f"trainer.nnodes={self.nnodes} needs torchrun's rendezvous: set trainer.launcher=torchrun (the "
                "DeepSpeed launcher spans nodes by trainer.hostfile)"
            )
        if (self.nnodes > 1) != (self.rdzv_endpoint is not None):
            raise ValueError(
                "trainer.nnodes > 1 and trainer.rdzv_endpoint=HOST:PORT go together: set both (several nodes) or "
                "neither (one node)"
            )
        # whether the machine can run the precision is not the config's business (a CPU head node plans bf16 runs):
        # the commands check it before they start (ragen_core.training.precision.resolve_precision)
        return self


class BootstrapConfig(Section):
    """Supervised warm-start on scripted demonstrations before RL (teaches the tiny model the reply format)."""

    enabled: bool = Field(False, description="Run the bootstrap before the first iteration.")
    policy: str = Field("random", description="Scripted policy that writes the demonstrations.")
    num_groups: PositiveInt = Field(64, description="Demonstration env instances.")
    group_size: PositiveInt = Field(8, description="Demonstrations per instance.")
    epochs: PositiveInt = Field(3, description="Passes over the demonstrations.")
    lr: LearningRate = Field(3e-3, description="Supervised learning rate.")
    batch_size: PositiveInt = Field(32, description="Demonstrations per optimizer step.")
    teacher_prob: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="The teacher_mix policy's probability of the teacher's move (else a random valid move), for the "
        "bootstrap and for rollout.scripted_policy=teacher_mix: the strength of the weak prior it teaches.",
    )
    seed: Seed | None = Field(
        None,
        description="Seed of the demonstrations and their SFT; None: the run's seed. Set it to start runs of "
        "different seeds from one bootstrapped model (built once, cached), as RL seeds of one base model.",
    )
