"""The model shapes the benchmarks run: the tiny default, a ~20M-parameter config and (GPU) a ~0.5B Qwen2 shape.

All are Qwen2-architecture models with random weights and the locally trained tokenizer (nothing is downloaded),
built once under ``benchmarks/.cache/models`` (git-ignored; ``RAGEN_BENCH_CACHE`` moves it) by the same builder as
the tiny default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import HERE
from ragen_core.config import TinyModelConfig

SHAPES: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig(),
    # ~20M parameters: 9 blocks of width 384 (the vocabulary is ~1k tokens, so nearly all of it is transformer)
    "20m": TinyModelConfig(hidden_size=384, num_layers=9, num_heads=6, num_kv_heads=2, intermediate_size=1536),
    # ~0.5B parameters in Qwen2-0.5B's block layout (GQA 14/2 heads, SwiGLU), widened because the local
    # vocabulary is ~1k tokens instead of 152k: 24 blocks of width 1024, MLP 5632
    "0.5b": TinyModelConfig(hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=2, intermediate_size=5632),
}


def model_dir(shape: str) -> Path:
    """The folder of the ``shape`` model, built on first use."""
    from ragen_core.policy import ensure_tiny_model

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; choose one of {', '.join(SHAPES)}")
    cache = Path(os.environ.get("RAGEN_BENCH_CACHE", HERE / ".cache")) / "models"
    return ensure_tiny_model(SHAPES[shape], cache)


def load(shape: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the ``shape`` model on ``device`` in ``dtype``."""
    from ragen_core.policy import load_policy

    model, tokenizer = load_policy(model_dir(shape), dtype=dtype)
    return model.to(device), tokenizer


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
