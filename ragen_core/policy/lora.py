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
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file of the adapters' weights (the only format read here)


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


def wrap_like(model: torch.nn.Module, settings: dict[str, Any]) -> Any:
    """``model`` wrapped with adapters of the ``settings`` another copy's :func:`adapter_settings` reports (the same
    layers, by their full paths; rank, alpha, dropout), so the two copies' parameters have the same names and shapes;
    the adapters' weights are to be copied in (this draws them from a fixed seed, leaving the global stream as it
    was)."""
    import peft

    config = peft.LoraConfig(
        r=int(settings["rank"]),
        lora_alpha=int(settings["alpha"]),
        lora_dropout=float(settings["dropout"]),
        target_modules=list(settings["target_modules"]),
        task_type="CAUSAL_LM",
        bias="none",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        torch.manual_seed(0)
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


def save_adapter(model: Any, folder: str | Path, state_dict: dict[str, Any] | None = None) -> None:
    """PEFT's ``save_pretrained`` of the adapters only (``adapter_config.json``, ``adapter_model.safetensors``);
    the embedding is never saved, so PEFT asks no hub whether the base model changed it. ``state_dict``: the
    weights to save where the module's own are partitioned (ZeRO-3's gather)."""
    extra = {"state_dict": state_dict} if state_dict is not None else {}
    model.save_pretrained(str(folder), save_embedding_layers=False, **extra)


def read_adapter(folder: str | Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """(PEFT's ``LoraConfig``, the weights by PEFT's key) of a LoRA adapter folder (``model.adapter``), read without
    running code: the settings as JSON, the weights from safetensors. A folder that is no LoRA adapter, or whose
    weights are only in a pickled format (``adapter_model.bin``), is a :class:`PolicyLoadError` naming it."""
    import peft
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (folder / name).is_file():
            raise PolicyLoadError(
                f"model.adapter {str(folder)!r} has no {name}: name a LoRA adapter folder as PEFT's save_pretrained "
                "writes it (a LoRA run's checkpoint holds one in adapter/; weights in a pickled format are never read)"
            )
    try:
        config = peft.LoraConfig.from_pretrained(str(folder))
    except (ValueError, TypeError, KeyError, OSError) as exc:  # damaged JSON, unknown keys, another peft_type
        raise PolicyLoadError(f"model.adapter {str(folder)!r}: {ADAPTER_CONFIG} is no LoRA config ({exc})") from None
    if not isinstance(config, peft.LoraConfig):
        raise PolicyLoadError(
            f"model.adapter {str(folder)!r} holds a {config.peft_type} adapter; only LoRA adapters are read"
        )
    try:
        return config, load_file(str(folder / ADAPTER_WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise PolicyLoadError(f"model.adapter {str(folder)!r}: {ADAPTER_WEIGHTS} is damaged ({exc})") from None


def attach_adapter(model: torch.nn.Module, folder: str | Path) -> Any:
    """``model`` wrapped with the adapters of ``folder`` (:func:`read_adapter`), as PEFT's ``from_pretrained`` would
    load them; the global random stream is left as it was."""
    import peft

    config, weights = read_adapter(folder)
    config.inference_mode = True
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = peft.get_peft_model(model, config)
    _load_weights(wrapped, weights, folder)
    return wrapped


def merge_adapter(model: torch.nn.Module, folder: str | Path) -> torch.nn.Module:
    """``model`` with the adapters of ``folder`` merged into its weights (``W + (alpha / r) B A``): a plain model of
    the same architecture, whose outputs equal the adapted model's up to rounding; every weight requires gradients
    again (the wrap froze them), as in a model just loaded."""
    return attach_adapter(model, folder).merge_and_unload().requires_grad_(True)


def start_adapters(wrapped: Any, folder: str | Path) -> None:
    """Load the weights of the adapter folder ``folder`` into ``wrapped`` (:func:`wrap_lora`'s model, of the run's
    ``actor.lora``): the folder's rank, alpha and adapted layers must be those of the run's adapters, else a
    :class:`PolicyLoadError` saying which settings continue it."""
    config, weights = read_adapter(folder)
    own = wrapped.peft_config["default"]
    if (config.r, config.lora_alpha) != (own.r, own.lora_alpha):
        raise PolicyLoadError(
            f"model.adapter {str(folder)!r} has rank {config.r} and alpha {config.lora_alpha}, actor.lora rank "
            f"{own.r} and alpha {own.lora_alpha}: set actor.lora.rank={config.r} actor.lora.alpha={config.lora_alpha} "
            "to train it on, or actor.lora=null to merge it into the start model"
        )
    _load_weights(wrapped, weights, folder)


def load_adapter_weights(wrapped: Any, folder: str | Path) -> None:
    """Copy the weights of the adapter folder ``folder`` (a LoRA policy's export, of the same adapters) into
    ``wrapped`` in place: a strict load (:func:`read_adapter`'s checks, then every adapter tensor, of its shape)."""
    _, weights = read_adapter(folder)
    _load_weights(wrapped, weights, folder)


def key_mismatch(expected: set[str], given: set[str], lacking: str, foreign: str) -> str:
    """How a strict load's ``given`` tensor names differ from the ``expected`` ones, for its error line ("" when
    equal): ``lacks N <lacking> (e.g. ...)`` and/or ``holds N tensors <foreign> (e.g. ...)``."""
    missing, extra = sorted(expected - given), sorted(given - expected)
    parts = [f"lacks {len(missing)} {lacking} (e.g. {missing[0]})"] if missing else []
    parts += [f"holds {len(extra)} tensors {foreign} (e.g. {extra[0]})"] if extra else []
    return " and ".join(parts)


def _load_weights(wrapped: Any, weights: dict[str, torch.Tensor], folder: str | Path) -> None:
    """A strict load of PEFT-keyed adapter weights: exactly the wrapped model's adapter tensors, of their shapes."""
    import peft

    what = key_mismatch(
        set(peft.get_peft_model_state_dict(wrapped)),
        set(weights),
        "of its adapter tensors",
        "the model has no adapter for",
    )
    if what:
        raise PolicyLoadError(
            f"model.adapter {str(folder)!r} {what}: it adapts other layers (actor.lora.target_modules) or another "
            "architecture than the start model"
        )
    shapes = dict(wrapped.named_parameters())
    for key, tensor in weights.items():
        name = key.replace(".weight", ".default.weight") if ".lora_" in key else key
        if name in shapes and tuple(shapes[name].shape) != tuple(tensor.shape):
            raise PolicyLoadError(
                f"model.adapter {str(folder)!r}: {key} has shape {tuple(tensor.shape)}, the model's "
                f"{tuple(shapes[name].shape)}: it was trained on another model (or another rank)"
            )
    with torch.no_grad():
        peft.set_peft_model_state_dict(wrapped, weights)


def write_merged(base_dir: str | Path, adapter: str | Path, out: str | Path) -> None:
    """A whole Hugging Face folder at ``out``: the model of ``base_dir`` (in its stored dtype) with the adapters of
    ``adapter`` merged into its weights, and the adapter folder's tokenizer (a checkpoint's: its chat template ends
    in the run's reply prefix). Loads with ``AutoModelForCausalLM`` alone; its outputs equal the adapted model's up
    to rounding."""
    from ragen_core.policy.loading import load_causal_lm, load_tokenizer, save_policy

    model = merge_adapter(load_causal_lm(base_dir, dtype="auto"), adapter)
    save_policy(model, load_tokenizer(adapter), out)
