"""Resume edge cases, in-process: a deleted newest checkpoint (fall back and replay stored batches), a quarantined
iteration (refused, or skipped on request), and a failed run that says where it failed."""

import shutil

import pytest
import torch

from ragen_core.config import build_config
from ragen_core.envs import base as env_base
from ragen_core.envs import register_env
from ragen_core.envs.bandit import BanditEnv
from ragen_core.run.decisions import ResumeError, plan_resume
from ragen_core.run.resume import restore_session
from ragen_core.run.session import open_session
from ragen_core.storage import DataLake, query
from ragen_core.training.checkpoint import load_checkpoint


def _config(model_dir, **sections):
    tree = {
        "model": {"path": str(model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 3, "checkpoint_every": 1, "keep_last": 3},
        "eval": {"every": 3, "instances": 2},
    }
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    return tree


def test_deleted_newest_checkpoint_falls_back_and_replays_to_the_same_weights(
    prefect_harness, tmp_path, tiny_model_dir
):
    from flows.train import train

    tree = _config(tiny_model_dir, algorithm={"adv_estimator": "gae"})  # a critic too: both engines are restored
    train(tree, data_root=str(tmp_path), run_id="cp")
    lake, config = DataLake(tmp_path), build_config(tree)
    assert [n for n, _ in lake.list_checkpoints("cp")] == [1, 2, 3]
    final = open_session(config, lake, "cp-probe", tiny_model_dir).updater
    load_checkpoint(lake.checkpoint_dir("cp", 3), final.actor, final.critic)
    shutil.rmtree(lake.checkpoint_dir("cp", 3))

    plan = plan_resume("cp", config, lake.committed_iterations("cp"), [], lake.list_checkpoints("cp"))
    assert (plan.checkpoint_updates, plan.replay) == (2, [2])
    session = open_session(config, lake, "cp", tiny_model_dir, resumed=lake.read_manifest("cp"))
    restore_session(session, plan)
    for name, engine in (("actor", "actor"), ("critic", "critic")):
        ours, theirs = getattr(session.updater, engine).module.state_dict(), getattr(final, engine).module.state_dict()
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), name


class _Overpaying(BanditEnv):
    def reward_bounds(self, max_actions):
        return 0.0, 0.5


@pytest.fixture
def overpaying_bandit():
    register_env("overpaying_bandit_r")(
        lambda **kw: _Overpaying(**{"name": "overpaying_bandit_r", "high_prob": 1.0, **kw})
    )
    yield
    del env_base._REGISTRY["overpaying_bandit_r"]


def test_quarantined_iteration_is_refused_then_skipped(prefect_harness, tmp_path, tiny_model_dir, overpaying_bandit):
    from flows.train import train
    from ragen_core.run.batches import BatchRejected

    tree = _config(
        tiny_model_dir,
        env={"name": "overpaying_bandit_r", "val_envs": ["bandit"]},
        rollout={"backend": "scripted", "scripted_policy": "expert"},
    )
    with pytest.raises(BatchRejected):
        train(tree, data_root=str(tmp_path), run_id="q")
    manifest = DataLake(tmp_path).read_manifest("q")
    assert (manifest.status, manifest.failed_iteration, manifest.failed_stage) == ("failed", 0, "validate")
    with pytest.raises(ResumeError, match="same seeds.*--skip-iteration"):
        train(tree, data_root=str(tmp_path), run_id="q")
    # skipping records iteration 0 as skipped; iteration 1 draws new seeds (and, with this env, fails again)
    with pytest.raises(BatchRejected):
        train(tree, data_root=str(tmp_path), run_id="q", skip_iteration=True)
    lake = DataLake(tmp_path)
    assert lake.committed_iterations("q") == [0]
    events = query(tmp_path, "SELECT iteration, kind FROM events WHERE run_id = 'q'").to_pylist()
    assert events == [{"iteration": 0, "kind": "skipped_iteration"}]
    assert (tmp_path / "quarantine" / "run_id=q" / "iteration=1" / "rollout" / "report.json").is_file()
    assert lake.read_manifest("q").failed_iteration == 1
