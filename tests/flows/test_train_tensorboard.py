"""End to end through the train flow (tiny Bandit run): the run folder holds TensorBoard event files whose steps are
the committed iterations and whose scalars equal the metrics table; ``monitor.tensorboard=false`` writes none."""

from __future__ import annotations

import numpy as np

from ragen_core.monitor.tensorboard_sink import event_file_name
from ragen_core.storage import DataLake
from tests.monitor.test_tensorboard_sink import duckdb_metrics, read_events


def small_config(model_dir, iterations: int, monitor: dict) -> dict:
    """A tiny Bandit run's config tree with the given ``monitor`` section."""
    return {
        "model": {"path": str(model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": iterations},
        "eval": {"every": 2, "instances": 4},
        "monitor": monitor,
    }


def test_train_flow_writes_one_event_file_per_committed_iteration(prefect_harness, tmp_path, tiny_model_dir):
    from flows.train import train

    root = tmp_path / "lake"
    train(small_config(tiny_model_dir, 2, {"tensorboard": True}), data_root=str(root), run_id="tb-on")
    train(small_config(tiny_model_dir, 1, {"tensorboard": False}), data_root=str(root), run_id="tb-off")
    lake = DataLake(root)
    committed = lake.committed_iterations("tb-on")
    assert committed == [0, 1, 2]  # two updates, then the final validation
    folder = lake.tensorboard_dir("tb-on")
    assert sorted(p.name for p in folder.iterdir()) == [event_file_name(i) for i in committed]
    events = read_events(folder)
    assert events == duckdb_metrics(root, "tb-on")  # every tag, every step, float32-equal to the table
    assert sorted({step for points in events.values() for step, _ in points}) == committed
    assert [step for step, _ in events["val/bandit/success"]] == [0, 2]  # eval.every = 2, and after the last update
    assert [step for step, _ in events["actor/entropy"]] == [0, 1]  # updates only
    assert all(np.isfinite(value) for _, value in events["time/update"])
    assert lake.committed_iterations("tb-off") == [0, 1]
    assert not lake.tensorboard_dir("tb-off").exists()
