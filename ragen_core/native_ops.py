"""DeepSpeed's just-in-time compiled C++ ops: where they are kept, and building them ahead of the first run.

``python -m ragen_core.native_ops`` (run by ``make install``) builds them once per virtual environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def use_environment_extensions_dir() -> Path | None:
    """Keep the C++ ops DeepSpeed compiles (its CPU shared-memory comm op, ~50-80 s to build) inside the virtual
    environment that runs them, unless the user chose a folder (``TORCH_EXTENSIONS_DIR``).

    torch's default, ~/.cache/torch_extensions, is shared by every environment of the user, and a build from another
    environment (another checkout, another venv path) does not match: each switch recompiled the op at the next
    run's first engine. Outside a virtual environment, or where it is not writable, the default stays.
    Returns the folder in use, or None for torch's default."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    if sys.prefix == sys.base_prefix:
        return None
    folder = Path(sys.prefix) / "var" / "torch_extensions"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(folder, os.W_OK):
        return None
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    return folder


def build_native_ops() -> list[str]:
    """Compile now what DeepSpeed would compile at a run's first engine (on CPU: the shared-memory comm op), so
    that no run, and no test, waits for it; ``make install`` calls this. Returns the names of the ops built or
    found already built (none on accelerators that need none)."""
    import torch

    use_environment_extensions_dir()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return []
    builder.load(verbose=False)
    return [builder.absolute_name()]


if __name__ == "__main__":
    folder = use_environment_extensions_dir()
    built = build_native_ops()
    print(f"native ops ready in {folder or 'torch default folder'}: {', '.join(built) or 'none needed'}")
