"""set_determinism, in a fresh process: torch's deterministic kernels on (warn-only), uninitialised memory not filled,
the configured thread count, and torch's compiler stack not imported for it (the import cost ~2 s per command)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # a fresh process

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys, torch
from ragen_core.config import build_config
from ragen_core.training.engines import set_determinism
before = "torch._inductor.config" in sys.modules
set_determinism(build_config({}, ["trainer.num_threads=1"]))
import torch.utils.deterministic
print(json.dumps({
    "enabled": torch.are_deterministic_algorithms_enabled(),
    "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
    "fill": torch.utils.deterministic.fill_uninitialized_memory,
    "threads": torch.get_num_threads(),
    "inductor_before": before,
    "inductor_after": "torch._inductor.config" in sys.modules,
}))
"""


def test_set_determinism_in_a_fresh_process():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state == {
        "enabled": True,
        "warn_only": True,
        "fill": False,
        "threads": 1,
        "inductor_before": False,
        "inductor_after": False,
    }


def test_an_already_loaded_compiler_config_is_kept_in_step():
    script = SCRIPT.replace("before = ", "import torch._inductor.config\nbefore = ") + (
        "\nprint(torch._inductor.config.deterministic)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    *_, state, flag = done.stdout.strip().splitlines()
    assert json.loads(state)["enabled"] is True and flag == "True"
