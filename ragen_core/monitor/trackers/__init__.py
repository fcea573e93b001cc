"""Experiment trackers (``monitor.trackers``): views of a run's ``metrics`` table in TensorBoard, MLflow and W&B.

- :mod:`~ragen_core.monitor.trackers.base`: what a tracker is, the registry, the check when the config loads;
- :mod:`~ragen_core.monitor.trackers.fanout`: a run's trackers together (started at the first commit, failures
  warned once, missed iterations logged from the lake, the plot at the end);
- one module per tracker: ``tensorboard_tracker``, ``mlflow_tracker``, ``wandb_tracker`` (each imports its package
  only when a run opens it).

A new tracker registers a :class:`~ragen_core.monitor.trackers.base.TrackerSpec` in
:data:`~ragen_core.monitor.trackers.base.TRACKERS` under the name ``monitor.trackers`` gives it.
"""

from ragen_core.monitor.trackers import mlflow_tracker, tensorboard_tracker, wandb_tracker  # noqa: F401 (register)
from ragen_core.monitor.trackers.base import TRACKERS, Tracker, TrackerRun, TrackerSpec, check_trackers
from ragen_core.monitor.trackers.fanout import RunTrackers

__all__ = ["TRACKERS", "RunTrackers", "Tracker", "TrackerRun", "TrackerSpec", "check_trackers"]
