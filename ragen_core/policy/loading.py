"""Loading a policy (model + tokenizer) from any local Hugging Face causal-LM directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class PolicyLoadError(ValueError):
    """The model directory is missing or incomplete."""


def load_tokenizer(model_dir: str | Path) -> Any:
    """Load the tokenizer of ``model_dir`` (offline)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local Hugging Face directory; nothing is downloaded."""
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise PolicyLoadError(
            f"model directory {str(model_dir)!r} has no config.json; point model.path at a local Hugging Face "
            "causal-LM folder (e.g. a Qwen2.5-0.5B-Instruct checkout) or leave it unset for the tiny default"
        )
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
    return model, load_tokenizer(model_dir)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable digest of the tokenizer's vocabulary, merges, normalisation and special tokens (recorded in every
    run manifest, so stored token ids are only re-trained on by a model that reads them the same way)."""
    import hashlib
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    payload = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    special = json.dumps(sorted(map(str, tokenizer.all_special_tokens)))
    return hashlib.sha256((payload + special).encode()).hexdigest()[:16]
