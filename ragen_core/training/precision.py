"""Numeric precision of the engines: fp32 on CPU, bf16 (or fp16 with loss scaling) on GPUs.

``trainer.precision`` is ``auto``, ``fp32``, ``bf16`` or ``fp16``. :func:`resolve_precision` turns it into the
precision a run actually uses (recorded in the run manifest): ``auto`` is bf16 on a CUDA device that supports it and
fp32 otherwise; an explicit bf16/fp16 without CUDA is refused, because CPU runs are the exact, reproducible reference
(and DeepSpeed's CPU accelerator has no fp16). :func:`precision_config` gives the DeepSpeed JSON sections.
"""

from __future__ import annotations

from typing import Any

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class PrecisionError(ValueError):
    """The requested precision cannot run on this machine; the message says what to set instead."""


def resolve_precision(requested: str, cuda_available: bool | None = None, bf16_supported: bool | None = None) -> str:
    """The precision to run with: ``auto`` -> bf16 on a bf16-capable CUDA device, else fp32; bf16/fp16 need CUDA.

    ``cuda_available`` / ``bf16_supported`` default to what torch reports (parameters for tests).
    """
    if requested not in ("auto", *PRECISIONS):
        raise PrecisionError(f"trainer.precision={requested!r} is unknown; use auto, fp32, bf16 or fp16")
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if bf16_supported is None:
        bf16_supported = bool(cuda and torch.cuda.is_bf16_supported())
    if requested == "auto":
        return "bf16" if cuda and bf16_supported else "fp32"
    if requested in ("bf16", "fp16") and not cuda:
        raise PrecisionError(
            f"trainer.precision={requested} needs a CUDA GPU and none is visible; CPU runs use fp32 "
            "(set trainer.precision=auto or fp32)"
        )
    if requested == "bf16" and not bf16_supported:
        raise PrecisionError(
            "trainer.precision=bf16: this GPU does not support bfloat16 (pre-Ampere); set trainer.precision=fp16 "
            "(loss-scaled) or fp32"
        )
    return requested


def torch_dtype(precision: str) -> torch.dtype:
    """The parameter dtype of a resolved precision."""
    try:
        return _DTYPES[precision]
    except KeyError:
        raise PrecisionError(f"precision {precision!r} is not resolved; use one of {', '.join(PRECISIONS)}") from None


def precision_config(precision: str, zero_stage: int) -> dict[str, Any]:
    """DeepSpeed config sections for ``precision`` (empty for fp32).

    bf16 keeps fp32 master weights in the optimizer; with ZeRO >= 1 gradients also accumulate in fp32 over the
    micro-batches (``data_types.grad_accum_dtype``; ZeRO-1 then uses DeepSpeed's BF16_Optimizer), while ZeRO-0 can
    only accumulate them in bf16. fp16 uses dynamic loss scaling (start 2**16, halve on overflow and skip the step,
    double after 1000 clean steps): an overflowing step is skipped, not applied.
    """
    torch_dtype(precision)  # validates the name
    if precision == "bf16":
        sections: dict[str, Any] = {"bf16": {"enabled": True}}
        if zero_stage >= 1:
            sections["data_types"] = {"grad_accum_dtype": "fp32"}
        return sections
    if precision == "fp16":
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,  # 0 = dynamic
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}
