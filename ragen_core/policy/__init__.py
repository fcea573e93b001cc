"""Policy model and tokenizer: loading any local Hugging Face directory, and the tiny offline default."""

from ragen_core.policy.loading import (
    PolicyLoadError,
    load_policy,
    load_tokenizer,
    save_policy,
    tokenizer_fingerprint,
)
from ragen_core.policy.tiny import ensure_tiny_model, tiny_model_key

__all__ = [
    "PolicyLoadError",
    "ensure_tiny_model",
    "load_policy",
    "load_tokenizer",
    "save_policy",
    "tiny_model_key",
    "tokenizer_fingerprint",
]
