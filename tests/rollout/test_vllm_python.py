"""Which program the vLLM server runs under (issue 39 item 1): a vLLM environment planted in a shared data root is
never taken for the default one, even when the command runs from inside that root."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from ragen_core.rollout.vllm_local import VLLM_ENV_FOLDER, BackendUnavailable, vllm_python


def _planted(root: Path) -> Path:
    python = root / VLLM_ENV_FOLDER / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (root / VLLM_ENV_FOLDER / ".installed").write_text("")
    return python


def test_a_vllm_environment_planted_in_the_data_root_is_not_the_default(tmp_path, monkeypatch):
    root = tmp_path / "shared-root"
    planted = _planted(root)
    monkeypatch.chdir(root)
    monkeypatch.delenv("RAGEN_VLLM_PYTHON", raising=False)
    beside = Path(sys.prefix).parent / VLLM_ENV_FOLDER
    try:
        chosen = vllm_python(None, data_root=root)
    except BackendUnavailable:
        return  # no vLLM environment beside this one: none at all, never the planted one
    assert chosen.resolve() != planted.resolve() and chosen.parent.parent == beside


def test_the_working_folder_candidate_stays_outside_a_data_root(tmp_path, monkeypatch):
    """The candidate in the working folder is still found when that folder is no data root (a checkout)."""
    checkout = tmp_path / "checkout"
    planted = _planted(checkout)
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("RAGEN_VLLM_PYTHON", raising=False)
    beside = Path(sys.prefix).parent / VLLM_ENV_FOLDER
    if (beside / ".installed").is_file():
        pytest.skip("a vLLM environment beside this one comes first")
    assert vllm_python(None, data_root=tmp_path / "elsewhere").resolve() == planted.resolve()
    with pytest.raises(BackendUnavailable):
        vllm_python(None, data_root=checkout)
