"""A run exists from its first moment and says how it ended: killed inside the bootstrap it is already in the
lake (its manifest is written before the bootstrap) and `ragen resume` finishes it; a resume that fails records
the failure in the manifest instead of leaving the run "running"."""

import json
import shutil
import signal

from ragen_core.storage import DataLake
from tests.flows.test_resume import _overrides, _ragen

RUN = "boot"
BOOTSTRAP = [
    "bootstrap.enabled=true",
    "bootstrap.num_groups=2",
    "bootstrap.group_size=2",
    "bootstrap.epochs=1",
    "bootstrap.batch_size=4",
]


def _manifest(root):
    return json.loads((DataLake(root).root / "runs" / RUN / "manifest.json").read_text())


def test_a_run_killed_in_its_bootstrap_resumes_and_a_failed_resume_is_recorded(
    tmp_path, tiny_model_dir, tiny_policy, prefect_server
):
    from ragen_core.training import ActorEngine, OptimConfig

    model, _ = tiny_policy  # DeepSpeed compiles a CPU op at its first engine: never inside a process that gets killed
    ActorEngine(model, OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    api_url = prefect_server[0].api_url
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith("bootstrap.")] + BOOTSTRAP
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *overrides]

    rc, output = _ragen(train, tmp_path, "bootstrap:demos", api_url)
    assert rc == -signal.SIGKILL, output[-3000:]
    manifest = _manifest(tmp_path)  # written before the bootstrap started
    assert manifest["status"] == "running" and not manifest.get("model_dir")
    created = manifest["created_at"]

    rc, output = _ragen(["resume", RUN], tmp_path, "update:inside@1", api_url)  # bootstrap again, then killed
    assert rc == -signal.SIGKILL, output[-3000:]
    manifest = _manifest(tmp_path)
    assert manifest["created_at"] == created and manifest["bootstrap"] and manifest["model_dir"]
    assert DataLake(tmp_path).committed_iterations(RUN) == [0]

    shutil.rmtree(tmp_path / manifest["model_dir"])  # the resume's start model (stored relative to the root) is gone
    rc, output = _ragen(["resume", RUN], tmp_path, None, api_url)
    assert rc != 0 and "Traceback" not in output, output[-3000:]
    failed = _manifest(tmp_path)
    assert failed["status"] == "failed" and failed["last_committed_iteration"] == 0, failed
    assert failed["error"] and failed["created_at"] == created
