"""Single-process distributed set-up so DeepSpeed runs without a launcher (CPU: gloo, GPU: nccl)."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A free TCP port on the loopback interface, chosen by the OS."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_single_process_env() -> None:
    """Set ``RANK``/``WORLD_SIZE``/``MASTER_*`` for a world of one unless a launcher already did.

    Without them DeepSpeed falls back to MPI discovery and fails. The port comes from the OS so two runs on one
    machine never collide.
    """
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
