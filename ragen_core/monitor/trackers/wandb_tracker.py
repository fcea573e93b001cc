"""The ``wandb`` tracker: one Weights & Biases run per ragen run, offline unless the user's ``WANDB_MODE`` says
otherwise, so a config never sends metrics anywhere by itself.

The run's files lie in ``runs/<run id>/trackers/wandb/`` (W&B's own ``offline-run-<time>-<id>/`` folders; ``wandb
sync`` uploads them later). The project is ``monitor.wandb.project``, else ``WANDB_PROJECT``, else ``ragen``; the
entity ``monitor.wandb.entity``, else W&B's default. The run is named after the ragen run, its W&B id kept in the
run's folder: a resumed attempt passes that id with ``resume="allow"`` (online, W&B continues the same run; offline,
``wandb sync`` of the attempts' folders appends them to one run). Console capture, system metrics, git and code
saving are off: the tracker records the run's metrics, not the process.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragen_core.monitor.trackers.base import TRACKERS, RunEnd, TrackerRun, TrackerSpec

DEFAULT_PROJECT = "ragen"
DEFAULT_MODE = "offline"
MAX_TAG = 64  # W&B refuses longer tags
EXIT_CODE = {"completed": 0, "failed": 1, "interrupted": 130}  # 130: the shell's code of a Ctrl-C


class WandbTracker:
    """An open W&B run."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id, "project": self.run.project}

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log({name: float(value) for name, value in scalars.items()}, step=step)

    def finish(self, status: RunEnd, plot: Path | None) -> None:
        if plot is not None:  # a file of the run (uploaded with it), not a history row that would shift its steps
            kept = Path(self.run.dir) / plot.name
            shutil.copyfile(plot, kept)
            self.run.save(str(kept), base_path=self.run.dir, policy="now")
        self.run.finish(exit_code=EXIT_CODE[status])


def wandb_tags(tags: Mapping[str, str]) -> list[str]:
    """``key:value`` tags (the run id is the run's name instead), each within W&B's 64 characters."""
    return [f"{key}:{value}"[:MAX_TAG] for key, value in tags.items() if key != "run_id"]


def open_wandb(run: TrackerRun) -> WandbTracker:
    """A W&B run for ``run`` in its folder: the stored id again (resumed), else a new one."""
    import wandb

    settings = run.settings.wandb
    project = settings.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
    run.subfolder("wandb")  # W&B's own folder in ours: no link planted there
    run.folder.mkdir(parents=True, exist_ok=True)
    stored_id = run.stored.get("id") if run.stored.get("project") == project else None
    opened = wandb.init(
        project=project,
        entity=settings.entity,
        dir=str(run.folder),  # W&B adds its own wandb/ folder
        id=stored_id if isinstance(stored_id, str) else None,
        resume="allow",
        name=run.run_id,
        tags=wandb_tags(run.tags),
        config=dict(run.params),
        mode=os.environ.get("WANDB_MODE") or DEFAULT_MODE,
        reinit="create_new",  # a process may hold several runs (tests, a sweep in one process)
        settings=wandb.Settings(
            console="off",
            silent=True,
            disable_git=True,
            save_code=False,
            disable_job_creation=True,
            x_disable_stats=True,
            x_save_requirements=False,
        ),
    )
    return WandbTracker(opened)


TRACKERS.add("wandb", TrackerSpec(open_wandb, package="wandb", extra="wandb"))
