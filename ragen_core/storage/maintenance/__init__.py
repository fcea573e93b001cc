"""The lake's maintenance wing: what works on a lake from outside its commit protocol, each taking the lake.

- :mod:`~ragen_core.storage.maintenance.compaction`: merge a run's committed part files (``ragen runs compact``);
- :mod:`~ragen_core.storage.maintenance.housekeeping`: the runs overview and the removal of whole runs
  (``ragen runs``, ``ragen runs rm``);
- :mod:`~ragen_core.storage.maintenance.upgrade`: a data root's layout upgrade (``ragen upgrade-lake``);
- :mod:`~ragen_core.storage.maintenance.export`: a Hugging Face ``datasets`` folder of chosen runs (``ragen export``);
- :mod:`~ragen_core.storage.maintenance.space`: writes that failed for want of space, and the space a run holds back.

It stands on the core lake (:mod:`ragen_core.storage`: layout, files, the commit protocol, the read path, locks),
which never imports it (``tests/test_architecture_lake.py``).
"""

from ragen_core.storage.maintenance.compaction import CompactionReport, compact_run
from ragen_core.storage.maintenance.housekeeping import (
    RemovalPlan,
    RunActiveError,
    RunNotFoundError,
    plan_removal,
    remove_run,
    runs_overview,
)

__all__ = [
    "CompactionReport",
    "RemovalPlan",
    "RunActiveError",
    "RunNotFoundError",
    "compact_run",
    "plan_removal",
    "remove_run",
    "runs_overview",
]
