"""The launched update group on the device equals the in-process update: the same published batch of the lake,
the same start weights, one StarPO update in this process (ZeRO-0) and in a group started by ``torchrun`` (the
run's own :class:`ragen_core.training.group.UpdateGroup`: 1 process, and 2 processes under ZeRO-2 where there are
2 GPUs), compared on every weight of the group's export and on the metrics.

fp32 on both sides: what is compared is the process boundary (the lake read, the group's engines, the export), not
the precision (tests/gpu/test_precision_gpu.py). With 2 ranks each runs exactly one micro-batch per optimizer step,
so the reduced gradient is the one-process sum up to the order of one fp32 addition. Tolerance as
tests/training/test_distributed.py's: 1e-5 relative, and 5e-3 * lr absolute where AdamW divides a gradient that is
~0 by its own magnitude (an update that is wrong moves weights by ~lr, 200x more).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.config import build_config
from ragen_core.run import stages
from ragen_core.run.iteration import IterationState
from ragen_core.run.session import open_session
from ragen_core.storage import DataLake
from ragen_core.training.group import UpdateGroup
from tests.training.test_distributed_group import _alive

pytestmark = pytest.mark.gpu

LR = 1e-3
RUN = "group"


def _tree(model_dir, launcher: str, nproc: int) -> dict:
    """16 Bandit rollouts of a scripted random player (the untrained tiny model only earns the format penalty, and
    equal scores leave nothing to learn), all kept, 2 optimizer steps of 8 rows in micro-batches of 4 (one per rank
    with 2)."""
    return {
        "seed": 7,
        "model": {"path": str(model_dir)},
        "env": {"name": "bandit", "val_envs": ["bandit"]},
        "rollout": {"env_groups": 4, "group_size": 4, "backend": "scripted", "scripted_policy": "random"},
        "algorithm": {"filter_ratio": 1.0},
        "actor": {"lr": LR, "mini_batch_size": 8, "micro_batch_size": 4, "zero_stage": 0 if nproc == 1 else 2},
        "trainer": {"launcher": launcher, "nproc": nproc, "precision": "fp32", "num_threads": 1},
        "bootstrap": {"enabled": False},
    }


@pytest.fixture(scope="module")
def in_process(device, tmp_path_factory, tiny_model_dir):
    """A lake with iteration 0's rollouts published, and the in-process update of them on the device: (lake, weights
    on the CPU, metrics)."""
    lake = DataLake(tmp_path_factory.mktemp("group-lake"))
    session = open_session(build_config(_tree(tiny_model_dir, "inprocess", 1)), lake, RUN, tiny_model_dir)
    try:
        assert session.updater.actor.device.type == device.name
        state = IterationState()
        for stage in (stages.generate_rollouts, stages.persist, stages.validate, stages.filter_and_publish):
            stage(session, 0, state)
        records = state.records
        metrics = session.updater.update(0)
        weights = {n: p.detach().cpu().clone() for n, p in session.updater.actor.module.named_parameters()}
    finally:
        session.close()
    assert len({r.total_reward for r in records}) > 1, "every rollout scored the same: nothing to learn from"
    return lake, weights, metrics


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_launched_group_update_equals_the_in_process_update(
    device, in_process, tiny_model_dir, tiny_policy, nproc
):
    if device.cuda and torch.cuda.device_count() < nproc:
        pytest.skip(f"{nproc} processes need {nproc} GPUs; {torch.cuda.device_count()} visible")
    lake, expected, expected_metrics = in_process
    config = build_config(_tree(tiny_model_dir, "torchrun", nproc))
    init = {
        "config": config.to_dict(),
        "data_root": str(lake.root),
        "run_id": RUN,
        "model_dir": str(tiny_model_dir),
        "precision": "fp32",
    }
    group = UpdateGroup.start("torchrun", nproc, None, lake.update_group_dir(RUN), init)
    try:
        assert group.world_size == nproc
        metrics, export = group.update(0)
        actual = load_file(export / "model.safetensors")
    finally:
        group.stop()
    assert not any(map(_alive, group.worker_pids)), "a worker outlived the group's stop"

    model, _ = tiny_policy
    start = dict(model.named_parameters())
    missing = set(expected) - set(actual)
    assert missing <= {"lm_head.weight"}, missing  # a tied output head is exported once, as the embedding
    moved = 0
    for name in expected.keys() & actual.keys():
        torch.testing.assert_close(
            actual[name], expected[name], rtol=1e-5, atol=5e-3 * LR, msg=lambda found, name=name: f"{name}: {found}"
        )
        moved += int((expected[name] - start[name].detach()).abs().max() > 0.1 * LR)
    assert moved > 10, "the update barely moved the policy: the comparison would not tell a wrong update"
    for key, value in expected_metrics.items():
        if not key.startswith(("time/", "perf/")):
            assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
