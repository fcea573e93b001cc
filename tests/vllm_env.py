"""The vLLM environment for the tests that need a real vLLM server (`make install-vllm` builds it)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from ragen_core.rollout.vllm_local import BackendUnavailable, vllm_python

REQUIRED = "RAGEN_REQUIRE_VLLM"  # set by CI: a missing vLLM environment fails these tests instead of skipping them


def require_vllm_python() -> Path:
    """The vLLM environment's Python; skips the test without it (fails it when ``RAGEN_REQUIRE_VLLM=1``)."""
    try:
        return vllm_python()
    except BackendUnavailable as exc:
        if os.environ.get(REQUIRED) == "1":
            pytest.fail(f"{REQUIRED}=1 but {exc}")
        pytest.skip(f"no vLLM environment: `make install-vllm` builds it ({exc})")


def server_processes(marker: str) -> list[int]:
    """Pids of live vLLM rollout servers whose command line mentions ``marker`` (a folder of the test's)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        command = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(part.endswith("vllm_server.py") for part in command) and any(marker in part for part in command):
            found.append(process.info["pid"])
    return found


def session_servers(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of live vLLM rollout servers started under the test session marked ``mark``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        command = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE or not any(p.endswith("vllm_server.py") for p in command):
            continue
        try:
            if process.environ().get("RAGEN_TEST_SESSION") == mark:
                found.append((process.info["pid"], " ".join(command)))
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found
