"""The deployments' pull step (prefect.yaml): where a worker's flow run finds the project's code.

Prefect resolves ``{{ $VAR }}`` in a pull step when the deployment is made, on the machine that deploys; a worker on
another host has its own checkout, at a path of its own. This step runs in each flow run's process, on the worker's
host, and takes that host's ``RAGEN_PROJECT_DIR`` (the worker's environment, which its flow runs inherit), falling
back to the deploying machine's folder."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_VARIABLE = "RAGEN_PROJECT_DIR"


def set_project_directory(default: str) -> dict[str, str]:
    """Change into this host's checkout (``$RAGEN_PROJECT_DIR``, else ``default``) and return it as the step's
    ``directory`` output. A folder without the flows is refused in one line naming it."""
    folder = Path(os.environ.get(PROJECT_VARIABLE) or default).expanduser()
    if not (folder / "flows" / "train.py").is_file():
        raise FileNotFoundError(
            f"{folder} holds no checkout of ragen-flows (no flows/train.py): set {PROJECT_VARIABLE} in the worker's "
            "environment to this host's checkout of the deployed commit"
        )
    os.chdir(folder)
    return {"directory": str(folder)}
