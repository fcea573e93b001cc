"""The GPU tests' device: CUDA by default (each test is skipped, with the reason, when torch sees none);
``RAGEN_GPU_TESTS_DEVICE=cpu`` runs the same test bodies on the CPU, so their logic is checked on machines without a
GPU (bf16 then runs on DeepSpeed's CPU accelerator and torch's CPU kernels).

DeepSpeed picks its accelerator once per process, from ``DS_ACCELERATOR`` (tests/conftest.py sets ``cpu`` for the
CPU suite): on CUDA it is set to ``cuda`` here, before any engine is built, and inherited by every command the tests
start. Run these tests in a pytest process of their own (``pytest -m gpu tests/gpu``): a session that built a CPU
engine first cannot switch, and the ``device`` fixture then fails instead of testing the wrong device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

DEVICE_VARIABLE = "RAGEN_GPU_TESTS_DEVICE"
DEVICES = ("cuda", "cpu")


def requested_device() -> str:
    """The device the GPU tests run on: ``RAGEN_GPU_TESTS_DEVICE`` (``cuda`` when unset)."""
    name = os.environ.get(DEVICE_VARIABLE, "cuda")
    if name not in DEVICES:
        raise pytest.UsageError(f"{DEVICE_VARIABLE}={name!r} is unknown; use cuda or cpu")
    return name


if requested_device() == "cuda" and torch.cuda.is_available():
    os.environ["DS_ACCELERATOR"] = "cuda"  # over tests/conftest.py's CPU default, before DeepSpeed is imported
    # cuBLAS is deterministic only with a fixed workspace; the runs already ask torch for deterministic kernels
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass(frozen=True)
class Device:
    """Where a GPU test runs and what its half precision is."""

    name: str  # "cuda" or "cpu"
    torch: torch.device
    half: str  # the engines' half precision here ("bf16" on both; the runs' `auto` is bf16 only on a GPU)

    @property
    def cuda(self) -> bool:
        return self.name == "cuda"


@pytest.fixture(scope="session")
def device() -> Device:
    """The device under test; skips (with the reason) when CUDA is asked for and torch sees none."""
    name = requested_device()
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"no CUDA device visible to torch (set {DEVICE_VARIABLE}=cpu to run this test's body on the CPU)")
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator().device_name()
    if accelerator != name:
        pytest.fail(
            f"DeepSpeed's accelerator is {accelerator!r}, not {name!r}: something built an engine before "
            "tests/gpu/conftest.py set DS_ACCELERATOR; run `pytest -m gpu tests/gpu` in its own process"
        )
    return Device(name, torch.device(name, 0) if name == "cuda" else torch.device("cpu"), "bf16")
