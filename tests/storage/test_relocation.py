"""A data root that moves (issue 51, item 1): a root copied with ``cp -a`` or moved with ``mv`` resumes, extends,
evaluates, re-trains and removes its runs, and finds its bootstrap, with the original gone; a manifest written
before paths were stored relative (absolute folders of the old root) is read under the new root too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ragen_core
from ragen_core.storage import DataLake
from ragen_core.storage.layout import manifest_file, run_dir
from ragen_core.storage.relocation import located_path, stored_path

RUN = "moved"
RAGEN = str(Path(sys.executable).with_name("ragen"))


def _config(iterations: int) -> dict:
    """The tiny default model (built inside the data root) and a short bootstrap, so every folder the run's
    manifests name lies inside the root."""
    return {
        "seed": 2,
        "env": {"name": "bandit", "val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 8, "micro_batch_size": 4},
        "trainer": {"iterations": iterations, "checkpoint_every": 1},
        "eval": {"every": 1, "instances": 2},
        "bootstrap": {"enabled": True, "num_groups": 2, "group_size": 4, "epochs": 1, "batch_size": 8},
        "monitor": {"truncated_share": None},
    }


class Stop(Exception):
    """Raised from the progress callback: the run stops after its first committed iteration."""


def _stop_after_first(iteration: int, metrics: dict) -> None:
    if iteration == 0:
        raise Stop


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A root with a completed run (with its bootstrap) and a run stopped after iteration 0."""
    root = tmp_path_factory.mktemp("original") / "data"
    ragen_core.train(_config(1), root, RUN)
    with pytest.raises(Stop):
        ragen_core.train(_config(2), root, "stopped", progress=_stop_after_first)
    return root


def _copy_away(original: Path, destination: Path, move: bool) -> Path:
    """``cp -a`` (or ``mv``) of a copy of ``original``, whose own path then disappears: nothing may read it."""
    staged = destination.parent / "staged"
    subprocess.run(["cp", "-a", str(original), str(staged)], check=True)
    if move:
        subprocess.run(["mv", str(staged), str(destination)], check=True)
    else:
        subprocess.run(["cp", "-a", str(staged), str(destination)], check=True)
        shutil.rmtree(staged)
    return destination


def test_a_manifest_names_the_folders_inside_its_root_relative_to_it(original):
    stored = json.loads(manifest_file(run_dir(original, RUN)).read_text())
    assert stored["model_dir"].startswith("models/bootstrap-")  # the run's start model: its bootstrap's
    [bootstrap] = [p.name for p in (original / "runs").iterdir() if p.name.startswith("bootstrap-")]
    built = json.loads(manifest_file(run_dir(original, bootstrap)).read_text())
    assert built["model_dir"] == f"models/{bootstrap}" and built["base_model"].startswith("models/tiny-")
    # read back, they are this root's folders
    assert DataLake(original).read_manifest(RUN).model_dir == str(original.resolve() / stored["model_dir"])


@pytest.mark.process  # `ragen resume`, `extend`, `eval`, `retrain` and `remove` on the relocated root
@pytest.mark.parametrize("move", [False, True], ids=["copied", "moved"])
def test_a_copied_or_moved_root_resumes_extends_evaluates_retrains_and_removes(original, tmp_path, move):
    root = _copy_away(original, tmp_path / "elsewhere", move)
    steps: list[str] = []
    resumed = ragen_core.resume("stopped", root, step=steps.append)
    assert resumed.status == "completed" and resumed.details["resumed"]["next_iteration"] == 1
    assert not any("bootstrap" in line and "demonstrations" in line for line in steps)  # its bootstrap was found
    extended = ragen_core.train(_config(2), root, RUN, force_config=["trainer.iterations"])
    assert extended.status == "completed" and DataLake(root).committed_iterations(RUN) == [0, 1, 2]
    evaluated = ragen_core.evaluate(f"{RUN}@1", root, n=2)
    assert evaluated.status == "completed"
    retrained = ragen_core.retrain(
        {"env": {"name": "bandit", "val_envs": ["bandit"]}, "eval": {"instances": 2}},
        f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND split = 'train'",
        f"run:{RUN}@2",
        root,
    )
    assert retrained.status == "completed"
    # a new run of the same config bootstraps from the copy's cached model, not again
    again = ragen_core.train(_config(1), root, "again")
    assert again.details["bootstrap"].get("cached") is True
    [bootstrap] = [p.name for p in (root / "runs").iterdir() if p.name.startswith("bootstrap-")]
    removed = subprocess.run(
        [RAGEN, "runs", "rm", bootstrap, "--yes", "--data-root", str(root)], capture_output=True, text=True
    )
    assert removed.returncode == 0, removed.stderr
    output = removed.stdout + removed.stderr
    assert "not removed" not in output and "again, moved, stopped" in output  # the runs that started from it
    assert not (root / "models" / bootstrap).exists() and not (root / "runs" / bootstrap).exists()


def test_a_manifest_with_the_old_roots_absolute_folders_is_read_under_the_new_root(original, tmp_path):
    root = _copy_away(original, tmp_path / "elsewhere", move=False)
    path = manifest_file(run_dir(root, "stopped"))
    stored = json.loads(path.read_text())
    stored["model_dir"] = str(original.resolve() / stored["model_dir"])  # as written before paths were relative
    path.write_text(json.dumps(stored))
    relative = Path(stored["model_dir"]).relative_to(original.resolve())
    assert DataLake(root).read_manifest("stopped").model_dir == str(root.resolve() / relative)
    assert ragen_core.resume("stopped", root).status == "completed"
    assert json.loads(path.read_text())["model_dir"] == relative.as_posix()  # written back relative


def test_stored_and_located_paths():
    root = Path("/data/root")
    assert stored_path("/data/root/models/tiny-1", root) == "models/tiny-1"
    assert stored_path("/data/rootless/models/tiny-1", root) == "/data/rootless/models/tiny-1"  # not inside
    assert stored_path("/elsewhere/qwen", root) == "/elsewhere/qwen"
    assert located_path("models/tiny-1", root) == "/data/root/models/tiny-1"
    assert located_path("../../etc", root) == "/etc"  # a place only: the trust check refuses it before any load
    assert located_path("/nowhere/models/tiny-1", root) == "/nowhere/models/tiny-1"  # no such place here either
