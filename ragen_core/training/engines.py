"""Building a run's engines from its config: the same code in the one-process session and in a launched group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ragen_core.algos import needs_critic
from ragen_core.config import RunConfig
from ragen_core.seeding import derive_seed
from ragen_core.training.actor import ActorEngine, OptimConfig
from ragen_core.training.critic import CriticEngine, ValueModel
from ragen_core.training.precision import torch_dtype


def set_determinism(config: RunConfig) -> None:
    """Fixed thread count and deterministic kernels where torch has them (every process that steps engines)."""
    import torch

    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    # torch.use_deterministic_algorithms is this flag plus torch._inductor's own (for torch.compile, which nothing
    # here uses); importing torch._inductor to set it cost 1.4 s at the start of every command and launched rank
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    if "torch._inductor.config" in sys.modules:  # already loaded by something else: keep the two in step
        sys.modules["torch._inductor.config"].deterministic = True
    # Deterministic mode also NaN-fills every torch.empty; DeepSpeed's ZeRO-1/2/3 allocate large buffers at
    # every step, which that turns into seconds of memset per step (measured: 8.5 s vs 0.1 s). Kernels stay
    # deterministic without it.
    torch.utils.deterministic.fill_uninitialized_memory = False


def attention_kernel(requested: str) -> str:
    """The attention implementation for transformers: ``auto`` is flash_attention_2 on CUDA with the flash-attn
    package installed, else sdpa."""
    if requested != "auto":
        return requested
    import importlib.util

    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def actor_optim(config: RunConfig, precision: str) -> OptimConfig:
    """The actor's optimisation settings (``precision`` resolved, see :mod:`ragen_core.training.precision`)."""
    return OptimConfig(
        lr=config.actor.lr,
        weight_decay=config.actor.weight_decay,
        grad_clip=config.actor.grad_clip,
        micro_batch_size=config.actor.micro_batch_size,
        zero_stage=config.actor.zero_stage,
        precision=precision,
        micro_batch_tokens=config.actor.micro_batch_tokens,
        gradient_checkpointing=config.actor.gradient_checkpointing,
        attn_implementation=attention_kernel(config.actor.attn_implementation),
    )


def critic_optim(config: RunConfig, precision: str) -> OptimConfig:
    """The critic's optimisation settings (unset batch sizes follow the actor's; ZeRO stage and precision too)."""
    critic = config.critic
    return OptimConfig(
        lr=critic.lr,
        weight_decay=critic.weight_decay,
        grad_clip=critic.grad_clip,
        micro_batch_size=critic.micro_batch_size or config.actor.micro_batch_size,
        zero_stage=config.actor.zero_stage,
        precision=precision,
        micro_batch_tokens=config.actor.micro_batch_tokens,
    )


def build_critic_engine(config: RunConfig, start_model_dir: Path, precision: str = "fp32") -> CriticEngine:
    """The critic's engine: a scalar head on the transformer of ``critic.path`` (default: the policy's start model)."""
    backbone_dir = Path(config.critic.path).expanduser().resolve() if config.critic.path else start_model_dir
    model = ValueModel.from_pretrained(backbone_dir, dtype=torch_dtype(precision), head_seed=config.seed)
    return CriticEngine(model, critic_optim(config, precision))


def start_engines(
    config: RunConfig, start_model_dir: Path, precision: str, training: bool = True
) -> tuple[ActorEngine, CriticEngine | None, Any]:
    """(actor, critic or None, tokenizer) from ``start_model_dir``. ``training=False`` (evaluation) skips the KL
    reference copy and the critic. With ``actor.lora`` the start model is the adapters' frozen base; the critic stays
    a whole model of its own, fully trained. With ``model.adapter`` the adapter folder is checked against the start
    model (:func:`check_adapter_base`), then starts the trained adapters (``actor.lora``) or is merged into the start
    model (no ``actor.lora``); the critic's backbone stays the start model without it."""
    from ragen_core.policy import load_policy
    from ragen_core.policy.lora import merge_adapter

    model, tokenizer = load_policy(start_model_dir, dtype=torch_dtype(precision))
    lora, lora_seed, adapter = _adapters(config)
    if adapter is not None:
        check_adapter_base(adapter, model)
        if lora is None:
            model = merge_adapter(model, adapter)
    keep_reference = training and config.algorithm.kl_coef > 0 and lora is None  # LoRA: the adapters off
    start = adapter if lora is not None else None
    actor = ActorEngine(model, actor_optim(config, precision), keep_reference, lora, lora_seed, start)
    critic = None
    if training and needs_critic(config.algorithm.adv_estimator):
        critic = build_critic_engine(config, start_model_dir, precision)
    return actor, critic, tokenizer


def policy_copy(config: RunConfig, start_model_dir: Path, dtype: Any) -> tuple[Any, Any]:
    """(model, tokenizer): a copy of the run's start policy outside the engines, built as :func:`start_engines` builds
    the actor's (a launched group's rollout copy): ``model.adapter`` merged without ``actor.lora``; with it, the
    run's adapters on the start model (their weights come with the group's hand-offs), in ``dtype`` throughout."""
    from ragen_core.policy import load_policy
    from ragen_core.policy.lora import merge_adapter, start_adapters, wrap_lora

    model, tokenizer = load_policy(start_model_dir, dtype=dtype)
    lora, lora_seed, adapter = _adapters(config)
    if adapter is not None and lora is None:
        model = merge_adapter(model, adapter)
    if lora is not None:
        model = wrap_lora(model, lora, lora_seed).to(dtype)
        if adapter is not None:
            start_adapters(model, adapter)
    return model, tokenizer


def _adapters(config: RunConfig) -> tuple[Any, int, Path | None]:
    """The run's ``actor.lora`` (None: full fine-tuning), the seed its adapters are drawn from, and ``model.adapter``
    resolved (None: none): what the engines and a rollout copy both build the policy from."""
    adapter = Path(config.model.adapter).expanduser().resolve() if config.model.adapter else None
    return config.actor.lora, derive_seed(config.seed, 0, "lora_init"), adapter


def check_adapter_base(adapter: Path, model: Any) -> None:
    """Adapters from one of our LoRA checkpoints (``<checkpoint>/adapter``, whose ``checkpoint.json`` records the
    sha256 of the weights they were trained on) go only onto that base: another start model is a
    :class:`~ragen_core.policy.PolicyLoadError` naming both digests. Adapters from elsewhere record no base."""
    from ragen_core.policy import PolicyLoadError
    from ragen_core.policy.lora import weights_digest
    from ragen_core.storage.layout import CHECKPOINT_ADAPTER, CHECKPOINT_INFO, checkpoint_file
    from ragen_core.training.checkpoint import read_checkpoint_info

    if adapter.name != CHECKPOINT_ADAPTER or not checkpoint_file(adapter.parent, CHECKPOINT_INFO).is_file():
        return
    expected = (read_checkpoint_info(adapter.parent).get("base_model") or {}).get("sha256")
    own = weights_digest(model)
    if expected and expected != own:
        raise PolicyLoadError(
            f"model.adapter {str(adapter)!r} was trained on another base model (sha256 of its weights {expected}, "
            f"the start model's {own}): set model.path to the start model of its run (`ragen runs show RUN`)"
        )
