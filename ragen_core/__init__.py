"""RAGEN-Flows core library: environments, agent, policy, rollouts, algorithms, training, storage.

The Python API (:mod:`ragen_core.api`) is reachable from the package: ``ragen_core.train``, ``resume``,
``evaluate``, ``retrain``, ``query``, ``runs``, ``plot``, ``export``, ``describe_config`` and ``run_sweep``
(``ragen_core.sweep`` is the sweep module; the API's ``ragen_core.api.sweep`` is the same function as ``run_sweep``),
with their results ``RunResult``, ``EvalResult``, ``SweepResult``. They are imported on first use: importing the
package stays light (every command, flow and worker imports it first).
"""

import importlib.abc
import os
import sys
from typing import Any

# OpenMP threads that wait for work spin by default; on a machine shared with other jobs a process's spinning threads
# take the cores the others need, its own included (measured at load 14-25: an SFT epoch of the demo's bootstrap took
# 144-270 s, and 12-21 s with passive waiting, the same losses). Passive waiting costs a machine of one's own little.
# Set before torch loads its OpenMP runtime (which reads the variable once, when it loads): every command, flow and
# worker of the project imports this package first, and the processes they start inherit it. A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class _NoMlflowForDeepSpeed(importlib.abc.MetaPathFinder):
    """Refuses MLflow to DeepSpeed's autotuner alone. DeepSpeed imports its autotuner with its config, and the
    autotuner imports MLflow when it is installed (the ``trackers`` extra) to log autotuning experiments, which this
    project never runs: MLflow, and pandas under it, took 2-3 s of every process that imports DeepSpeed (a command
    that trains, each rank of a launched group, every test worker). Refused, the autotuner's ``try: import mlflow``
    fails and it logs nothing. Any other importer (the MLflow tracker) gets MLflow as usual, and where MLflow is
    already imported the autotuner gets it too (Python looks in ``sys.modules`` before asking finders)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "mlflow":
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_globals.get("__name__") == "deepspeed.autotuning.autotuner":
                    raise ModuleNotFoundError("MLflow is not imported for DeepSpeed's autotuner", name=name)
                frame = frame.f_back
        return None


if not any(isinstance(finder, _NoMlflowForDeepSpeed) for finder in sys.meta_path):
    sys.meta_path.insert(0, _NoMlflowForDeepSpeed())

# the package's name -> the API's
API = {
    "train": "train",
    "resume": "resume",
    "evaluate": "evaluate",
    "retrain": "retrain",
    "query": "query",
    "run_sweep": "sweep",
    "runs": "runs",
    "plot": "plot",
    "export": "export",
    "describe_config": "describe_config",
    "RunResult": "RunResult",
    "EvalResult": "EvalResult",
    "SweepResult": "SweepResult",
}


def __getattr__(name: str) -> Any:
    """The API's functions and results, imported on first use (:mod:`ragen_core.api`)."""
    if name in API:
        from ragen_core import api

        return getattr(api, API[name])
    raise AttributeError(f"module 'ragen_core' has no attribute {name!r}")


__all__ = [*API]
