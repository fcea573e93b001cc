"""Where DeepSpeed's compiled ops are kept (the virtual environment's own folder unless the user chose one), and
that the ahead-of-time build leaves the op loadable there."""

import os
import sys
from pathlib import Path

import pytest

from ragen_core.native_ops import build_native_ops, use_environment_extensions_dir


@pytest.fixture
def unset_folder(monkeypatch):
    """TORCH_EXTENSIONS_DIR unset during the test and put back after it, also when the code under test set it (a
    bare ``delenv`` of an absent variable records nothing to undo, and a temporary folder left in it would make
    every later DeepSpeed engine of the test process recompile its op there)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")  # records the value before the test for the undo
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")


def test_a_folder_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert use_environment_extensions_dir() == tmp_path / "mine"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


def test_a_virtual_environment_keeps_its_own_folder(monkeypatch, tmp_path, unset_folder):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "python"))
    folder = tmp_path / "venv" / "var" / "torch_extensions"
    assert use_environment_extensions_dir() == folder and folder.is_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(folder)


def test_outside_a_virtual_environment_or_read_only_the_default_stays(monkeypatch, tmp_path, unset_folder):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path))
    assert use_environment_extensions_dir() is None and "TORCH_EXTENSIONS_DIR" not in os.environ
    monkeypatch.setattr(sys, "prefix", "/proc/no-such-venv")  # cannot be created
    assert use_environment_extensions_dir() is None and "TORCH_EXTENSIONS_DIR" not in os.environ


def test_the_cpu_comm_op_is_built_into_the_folder_in_use(unset_folder):
    built = build_native_ops()  # already built by `make install`: loads it
    assert built == ["deepspeed.ops.comm.deepspeed_shm_comm_op"]
    folder = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert folder == use_environment_extensions_dir()
    assert list(folder.rglob("deepspeed_shm_comm*.so")), sorted(folder.rglob("*"))
