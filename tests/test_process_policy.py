"""The project's processes wait passively on a shared machine: OpenMP's wait policy is set before torch loads its
runtime (which reads it once), by whichever door a process comes in (the CLI, a flow run, the update group's worker),
and a user's own setting is kept. And DeepSpeed, imported after the package, leaves MLflow unimported (its
autotuner would import it, ~2-3 s a process) while MLflow stays importable for the MLflow tracker."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # a fresh process per door

# Records the wait policy at the moment torch is first imported, then imports the door and something that loads torch.
PROBE = """
import os, sys
class Hook:
    def find_spec(self, name, path, target=None):
        if name == "torch":
            print("policy at torch import:", os.environ.get("OMP_WAIT_POLICY"))
            sys.meta_path.remove(self)
        return None
sys.meta_path.insert(0, Hook())
import {door}
import ragen_core.policy
"""


@pytest.mark.parametrize("door", ["ragen_cli.main", "flows.train", "ragen_core.training.worker"])
@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_waits_passively_unless_the_user_says_otherwise(door, given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(door=door)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [f"policy at torch import: {expected}"]


MLFLOW_PROBE = """
import sys
import ragen_core
import deepspeed.autotuning.autotuner as autotuner
print("mlflow imported:", "mlflow" in sys.modules, "autotuner has it:", autotuner.has_mlflow)
import mlflow
print("then:", mlflow.__name__, hasattr(mlflow, "start_run"))
"""


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="no MLflow (make install-trackers)")
def test_deepspeed_is_imported_without_mlflow_and_mlflow_still_imports():
    result = subprocess.run([sys.executable, "-c", MLFLOW_PROBE], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["mlflow imported: False autotuner has it: False", "then: mlflow True"]
