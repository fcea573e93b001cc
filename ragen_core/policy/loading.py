"""Loading a policy (model + tokenizer) from any local Hugging Face causal-LM directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


class PolicyLoadError(ValueError):
    """The model directory is missing or incomplete."""


# Files of a model folder that can ask transformers to import the folder's own Python code.
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", "generation_config.json")


def refuse_remote_code(model_dir: str | Path) -> None:
    """Raise :class:`PolicyLoadError` when a file of ``model_dir`` declares custom code (``auto_map``): a model
    folder never runs its own code here (every load passes ``trust_remote_code=False``, and this says why before
    transformers would prompt or fail). The files are read as JSON, nothing else."""
    for name in REMOTE_CODE_FILES:
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        try:
            content = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PolicyLoadError(f"{str(path)!r} is not readable JSON ({exc}); the model folder is damaged") from None
        if isinstance(content, dict) and "auto_map" in content:
            raise PolicyLoadError(
                f"model directory {str(model_dir)!r} declares its own code ({name}: auto_map "
                f"{sorted(content['auto_map'])}); models are loaded without running a folder's code "
                "(trust_remote_code=False): use a model of an architecture transformers ships (Qwen2, Llama, ...)"
            )


def load_tokenizer(model_dir: str | Path) -> Any:
    """Load the tokenizer of ``model_dir`` (offline, never running the folder's own code)."""
    from transformers import AutoTokenizer

    refuse_remote_code(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local Hugging Face directory; nothing is downloaded, no code of the folder
    runs."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise PolicyLoadError(
            f"model directory {str(model_dir)!r} has no config.json; point model.path at a local Hugging Face "
            "causal-LM folder (e.g. a Qwen2.5-0.5B-Instruct checkout) or leave it unset for the tiny default"
        )
    model = load_causal_lm(model_dir, dtype)
    return model, load_tokenizer(model_dir)


def load_causal_lm(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The causal LM of a local Hugging Face directory: offline, never running the folder's own code; a folder
    transformers cannot read is a :class:`PolicyLoadError` naming it."""
    from transformers import AutoModelForCausalLM

    refuse_remote_code(model_dir)
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, local_files_only=True, trust_remote_code=False
        )
    except (ValueError, KeyError) as exc:  # an unknown model_type or a config transformers cannot map
        raise PolicyLoadError(f"model directory {str(model_dir)!r} cannot be loaded as a causal LM: {exc}") from None


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable digest of the tokenizer's vocabulary, merges, normalisation and special tokens (recorded in every
    run manifest, so stored token ids are only re-trained on by a model that reads them the same way)."""
    import hashlib
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    payload = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    special = json.dumps(sorted(map(str, tokenizer.all_special_tokens)))
    return hashlib.sha256((payload + special).encode()).hexdigest()[:16]


def save_policy(model: Any, tokenizer: Any, folder: str | Path, state_dict: dict[str, Any] | None = None) -> None:
    """Write ``model`` (``state_dict``: its weights when the module does not hold them whole) and ``tokenizer`` into
    ``folder`` as a Hugging Face folder, its files readable as the user's umask says: transformers writes the weights
    through a private temporary file (mode 0600), which would keep a shared data root's models from its other users."""
    folder = Path(folder)
    model.save_pretrained(str(folder), **({"state_dict": state_dict} if state_dict is not None else {}))
    tokenizer.save_pretrained(str(folder))
    follow_umask(folder)


def follow_umask(folder: str | Path) -> None:
    """Give the plain files of ``folder`` the mode a new file gets under the user's umask (``0o666 & ~umask``)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)
