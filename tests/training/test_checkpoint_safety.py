"""Nothing in a checkpoint is trusted: files are checked against the sha256 digests of checkpoint.json before a load,
and DeepSpeed's state files are read without running code (a planted pickle with a matching digest is refused)."""

import copy
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen_core.storage import DataLake
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.training.checkpoint import (
    ENGINE_TAG,
    INFO_FILE,
    CheckpointError,
    load_checkpoint,
    read_checkpoint_info,
    save_checkpoint,
)
from ragen_core.training.checkpoint_files import safe_engine_loading
from tests.training.test_checkpoint import _same_parameters, _train, update_batch  # noqa: F401 (a fixture)

RUN = "run-a"
MODEL_STATE = f"actor/{ENGINE_TAG}/mp_rank_00_model_states.pt"
ZERO2_OPTIM_STATE = f"actor/{ENGINE_TAG}/zero_pp_rank_0_mp_rank_00_optim_states.pt"


class _MakesMarker:
    """Pickles as a call of ``open(marker, "w")``: unpickling it with plain pickle creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _actor(tiny_policy, zero_stage: int = 0) -> ActorEngine:
    optim = OptimConfig(lr=1e-2, weight_decay=0.01, grad_clip=1.0, micro_batch_size=4, zero_stage=zero_stage)
    return ActorEngine(copy.deepcopy(tiny_policy[0]), optim)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_policy, update_batch):  # noqa: F811
    """{ZeRO stage: (checkpoint folder, the trained actor)} for stages 0 (optimizer state inside the model state
    file) and 2 (a separate ZeRO optimizer file, read by another code path of DeepSpeed)."""
    found = {}
    for stage in (0, 2):
        actor = _actor(tiny_policy, stage)
        _train(update_batch, actor, None, seed=1)
        root = tmp_path_factory.mktemp(f"zero{stage}")
        found[stage] = (save_checkpoint(DataLake(root), RUN, 1, actor, None, tiny_policy[1], {}), actor)
    return found


def _copy(saved, stage: int, tmp_path: Path) -> Path:
    """A private copy of the saved checkpoint, to damage."""
    return Path(shutil.copytree(saved[stage][0], tmp_path / "iteration=1"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoint_json_records_the_sha256_of_every_file(saved):
    path = saved[0][0]
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != INFO_FILE)
    recorded = read_checkpoint_info(path)["files"]
    assert sorted(recorded) == files and MODEL_STATE in files and "hf/model.safetensors" in files
    assert all(recorded[name] == _sha256(path / name) for name in files)


@pytest.mark.parametrize(("stage", "target"), [(0, MODEL_STATE), (2, ZERO2_OPTIM_STATE)])
def test_a_planted_pickle_with_a_matching_digest_runs_nothing(saved, tiny_policy, tmp_path, stage, target):
    path = _copy(saved, stage, tmp_path)
    marker = tmp_path / "marker"
    torch.save({"module": _MakesMarker(marker)}, path / target)
    info = json.loads((path / INFO_FILE).read_text())
    info["files"][target] = _sha256(path / target)  # whoever planted it could rewrite checkpoint.json too
    (path / INFO_FILE).write_text(json.dumps(info))

    actor = _actor(tiny_policy, stage)
    with pytest.raises(CheckpointError, match="refusing to load .*" + target.split("/")[-1]) as caught:
        load_checkpoint(path, actor)
    assert "it refers to io.open" in str(caught.value)  # the reason: the callable the file asked for
    assert not marker.exists()
    assert type(actor.engine.checkpoint_engine).__name__ == "TorchCheckpointEngine"  # the swap was undone

    torch.load(path / target, weights_only=False)  # the control: DeepSpeed's own loader would have run it
    assert marker.exists()


def test_a_changed_byte_is_refused_before_any_engine_changes(saved, tiny_policy, tmp_path):
    path = _copy(saved, 0, tmp_path)
    data = bytearray((path / MODEL_STATE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / MODEL_STATE).write_bytes(bytes(data))
    actor = _actor(tiny_policy)
    with pytest.raises(CheckpointError, match=f"{MODEL_STATE}' does not match the sha256"):
        load_checkpoint(path, actor)
    assert _same_parameters(actor.module, tiny_policy[0])


def test_an_extra_or_missing_file_is_refused(saved, tiny_policy, tmp_path):
    path = _copy(saved, 0, tmp_path)
    (path / "actor" / ENGINE_TAG / "extra.pt").write_bytes(b"not ours")
    with pytest.raises(CheckpointError, match="extra.pt' is not a file of this checkpoint"):
        load_checkpoint(path, _actor(tiny_policy))
    (path / "actor" / ENGINE_TAG / "extra.pt").unlink()
    (path / "actor" / ENGINE_TAG / "linked").symlink_to(path / "hf", target_is_directory=True)
    with pytest.raises(CheckpointError, match="linked' is not a file of this checkpoint"):
        load_checkpoint(path, _actor(tiny_policy))
    (path / "actor" / ENGINE_TAG / "linked").unlink()

    info = json.loads((path / INFO_FILE).read_text())
    info["files"]["actor/state/gone.pt"] = "0" * 64
    (path / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(CheckpointError, match="gone.pt' is missing"):
        load_checkpoint(path, _actor(tiny_policy))
    info["files"] = {"actor/../../outside": "0" * 64}
    (path / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(CheckpointError, match="not a path inside the checkpoint folder"):
        load_checkpoint(path, _actor(tiny_policy))
    del info["files"]  # a version-2 checkpoint.json without digests was edited, not written by an old version
    (path / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(CheckpointError, match="lacks the 'files' digests"):
        load_checkpoint(path, _actor(tiny_policy))


def test_an_old_checkpoint_without_digests_loads_safely_with_a_warning(saved, tiny_policy, tmp_path, caplog):
    path, trained = saved[0]
    old = _copy(saved, 0, tmp_path)
    info = json.loads((old / INFO_FILE).read_text())
    del info["files"]
    info["format_version"] = 1
    (old / INFO_FILE).write_text(json.dumps(info))
    actor = _actor(tiny_policy)
    with caplog.at_level(logging.WARNING, logger="ragen_core.training.checkpoint"):
        load_checkpoint(old, actor)
    assert "predates file digests" in caplog.text
    assert _same_parameters(actor.module, trained.module) and not _same_parameters(actor.module, tiny_policy[0])

    marker = tmp_path / "marker"  # no digests to check, still no code run
    torch.save({"module": _MakesMarker(marker)}, old / MODEL_STATE)
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_checkpoint(old, _actor(tiny_policy))
    assert not marker.exists()


def test_the_safe_engine_is_swapped_in_for_the_load_only(tiny_policy):
    engine = _actor(tiny_policy).engine
    original = engine.checkpoint_engine
    with pytest.raises(ValueError, match="inside"):
        with safe_engine_loading(engine):
            assert type(engine.checkpoint_engine).__name__ == "SafeCheckpointEngine"
            raise ValueError("inside")
    assert engine.checkpoint_engine is original


def test_ragen_resume_of_a_garbage_checkpoint_fails_in_one_line(prefect_harness, tmp_path, tiny_model_dir):
    from prefect.settings import PREFECT_API_URL

    from flows.train import train

    tree = {
        "model": {"path": str(tiny_model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 1, "checkpoint_every": 1},
        "eval": {"every": 1, "instances": 2},
    }
    train(tree, data_root=str(tmp_path), run_id="g")
    state = DataLake(tmp_path).checkpoint_dir("g", 1) / MODEL_STATE
    state.write_bytes(os.urandom(state.stat().st_size))

    env = {k: v for k, v in os.environ.items() if k not in ("RAGEN_FAULT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    longer = ["--force-config", "trainer.iterations", "trainer.iterations=2"]  # a completed run, extended
    args = ["resume", "g", "--data-root", str(tmp_path), *longer]
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ragen")), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), done.stderr[-3000:]
    assert "mp_rank_00_model_states.pt" in errors[0] and "sha256" in errors[0]
    assert "Traceback" not in done.stdout + done.stderr
