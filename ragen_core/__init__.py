"""RAGEN-Flows core library: environments, agent, policy, rollouts, algorithms, training, storage.

The Python API (:mod:`ragen_core.api`) is reachable from the package: ``ragen_core.train``, ``resume``,
``evaluate``, ``retrain``, ``query``, ``runs``, ``plot``, ``export``, ``describe_config`` and ``run_sweep``
(``ragen_core.sweep`` is the sweep module; the API's ``ragen_core.api.sweep`` is the same function as ``run_sweep``),
with their results ``RunResult``, ``EvalResult``, ``SweepResult``. They are imported on first use: importing the
package stays light (every command, flow and worker imports it first).
"""

import os
from typing import Any

# OpenMP threads that wait for work spin by default; on a machine shared with other jobs a process's spinning threads
# take the cores the others need, its own included (measured at load 14-25: an SFT epoch of the demo's bootstrap took
# 144-270 s, and 12-21 s with passive waiting, the same losses). Passive waiting costs a machine of one's own little.
# Set before torch loads its OpenMP runtime (which reads the variable once, when it loads): every command, flow and
# worker of the project imports this package first, and the processes they start inherit it. A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
