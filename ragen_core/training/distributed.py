"""Single-process distributed set-up so DeepSpeed runs without a launcher (CPU: gloo, GPU: nccl).

Nothing here listens beyond the loopback interface. torch's ``env://`` rendezvous would start a TCP store, whose
server socket binds every interface whatever ``MASTER_ADDR`` says; a world of one needs no rendezvous at all, so the
default process group is created here on an in-process ``HashStore`` before DeepSpeed looks for one (DeepSpeed then
uses it as it is). gloo's own socket binds the address the host name resolves to unless ``GLOO_SOCKET_IFNAME``
names an interface: it is pointed at the loopback interface when the user has not chosen one.
"""

from __future__ import annotations

import os
import socket

from ragen_core.native_ops import use_environment_extensions_dir

LOOPBACK_INTERFACES = ("lo", "lo0")  # Linux, macOS/BSD
_state = {"owned": False}  # whether this module set the rank variables (then it also owns the process group)


def free_port() -> int:
    """A free TCP port on the loopback interface, chosen by the OS."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux), or None if it cannot be found."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((name for name in LOOPBACK_INTERFACES if name in names), None)


def ensure_single_process_env() -> None:
    """Set ``RANK``/``WORLD_SIZE``/``MASTER_*`` for a world of one and create its process group, unless a launcher
    already did.

    Without them DeepSpeed falls back to MPI discovery and fails. The port comes from the OS so two runs on one
    machine never collide (kept for tools that read it; the group itself needs no port, see the module docstring).
    """
    use_environment_extensions_dir()
    if _state["owned"]:
        init_single_process_group()  # again, should someone have destroyed the group since
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    _state["owned"] = True
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    interface = loopback_interface()
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    init_single_process_group()


def init_single_process_group() -> None:
    """The default process group of a world of one, on an in-process store (no socket); a no-op if one exists."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return
    from deepspeed.accelerator import get_accelerator

    backend = get_accelerator().communication_backend_name()  # what deepspeed.init_distributed would pick
    if get_accelerator().device_name() == "cuda":
        get_accelerator().set_device(0)
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
