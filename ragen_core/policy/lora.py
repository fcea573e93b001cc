"""LoRA adapters on the policy (PEFT): wrapping a causal LM, what the wrap leaves trainable, and saving the adapters.

PEFT is imported inside the functions (as ``deepspeed`` is by the engines), so commands that train no adapter do not
load it. The wrap is a ``PeftModelForCausalLM``: its forward, ``generate`` and ``disable_adapter`` reach the base
model with the adapters on (or off), so the engines and the in-process sampler use it as they use the bare model.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ragen_core.policy.loading import PolicyLoadError

if TYPE_CHECKING:
    from ragen_core.config import LoraConfig

ADAPTER_MARK = "lora_"  # in the name of every adapter parameter (``...q_proj.lora_A.default.weight``)
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's file of the adapters' settings, beside their weights


def wrap_lora(model: torch.nn.Module, settings: LoraConfig, seed: int) -> Any:
    """``model`` (on the CPU, before any engine wraps it) with fresh LoRA adapters of ``settings``; every base weight
    frozen, the adapters trainable. The adapters' ``A`` matrices are drawn from the torch generator seeded with
    ``seed`` (their ``B`` start at 0: the wrapped model computes what ``model`` did); the global stream is left as it
    was. A layer name of ``settings.target_modules`` that names no linear layer is a :class:`PolicyLoadError`."""
    import peft

    targets = settings.target_modules
    if targets != "all-linear":
        _check_targets(model, list(targets))
    config = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets if targets == "all-linear" else list(targets),
        task_type="CAUSAL_LM",
        bias="none",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # PEFT asks transformers' deprecated is_gradient_checkpointing, which warns at every wrap
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Each name must end the dotted path of a linear layer (PEFT's rule), or the adapters would silently skip it."""
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    for target in targets:
        if not any(name == target or name.endswith("." + target) for name in linear):
            suffixes = sorted({name.split(".")[-1] for name in linear})
            raise PolicyLoadError(
                f"actor.lora.target_modules: {target!r} names no linear layer of {type(model).__name__}; its linear "
                f"layers end with {', '.join(suffixes)} (or use 'all-linear')"
            )


def is_adapted(model: Any) -> bool:
    """Whether ``model`` is a PEFT wrap (without importing PEFT when nothing did)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def forward_of(model: Any) -> Any:
    """The forward that takes the model's keyword arguments: the base model's under a PEFT wrap (whose own forward
    passes them through as ``**kwargs``, so its signature does not show ``logits_to_keep``)."""
    return model.get_base_model().forward if is_adapted(model) else model.forward


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The adapter parameters' names, in the module's order."""
    return [name for name, _ in model.named_parameters() if ADAPTER_MARK in name]


def adapter_settings(model: Any) -> dict[str, Any]:
    """What a checkpoint records of the adapters: rank, alpha, dropout and the adapted layers (full dotted paths,
    sorted), as PEFT resolved them."""
    config = model.peft_config["default"]
    return {
        "rank": int(config.r),
        "alpha": int(config.lora_alpha),
        "dropout": float(config.lora_dropout),
        "target_modules": sorted(model.base_model.targeted_module_names),
    }


def weights_digest(model: torch.nn.Module) -> str:
    """The sha256 of every parameter's name, dtype, shape and bytes (in the module's order): the identity of the
    base model an adapter was trained on."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            data = parameter.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{name}:{data.dtype}:{tuple(parameter.shape)};".encode())
            digest.update(data.view(torch.uint8).numpy())
    return digest.hexdigest()


def save_adapter(model: Any, folder: str | Path) -> None:
    """PEFT's ``save_pretrained`` of the adapters only (``adapter_config.json``, ``adapter_model.safetensors``);
    the embedding is never saved, so PEFT asks no hub whether the base model changed it."""
    model.save_pretrained(str(folder), save_embedding_layers=False)
