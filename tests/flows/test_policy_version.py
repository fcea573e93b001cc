"""The contract between the schedule and the rollout side: a training batch is sampled only by the weights of the
policy version its rows will carry. Planted faults: a hand-off the updater never made (sync: the rollout side keeps
the weights before the update, a LoRA run's base model), and a hand-off the async run's sampler process never took.
Each stops the run in one line before any row of the batch is stored; the resume without the fault completes with
exactly the rows of the run that never met it (trained through the Python API, ``ragen_core.train``)."""

import pytest

import ragen_core
from ragen_core.rollout.policy import RolloutPolicy
from ragen_core.rollout.sampling import PolicyVersionError
from ragen_core.storage import DataLake
from ragen_core.training.updater import InProcessUpdater
from tests.flows.test_launcher import NOT_COMPARED

BASE = {
    "seed": 5,
    "env": {"val_envs": ["bandit"]},
    "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 6},
    "actor": {"mini_batch_size": 8, "micro_batch_size": 4, "lr": 0.05, "lora": {"rank": 4, "alpha": 32}},
    "trainer": {"iterations": 3, "checkpoint_every": 1},
    "eval": {"every": 3, "instances": 2},
}
PLANTED = {  # (the method left undone, the extra settings, the batch refused, the version it needs, the one held)
    "sync-missed-sync": ("sync", {}, 1, 1, 0),
    "async-missed-hand-off": ("hand_off", {"trainer": {"iterations": 3, "max_staleness": 1}}, 2, 1, 0),
}


def _config(tiny_model_dir, extra: dict) -> dict:
    config = {**BASE, "model": {"path": str(tiny_model_dir)}}
    return {**config, **{key: {**BASE.get(key, {}), **value} for key, value in extra.items()}}


def _rows(root, run_id: str, table: str) -> list[str]:
    rows = DataLake(root).read_table(table, run_id).to_pylist()
    if table == "metrics":
        rows = [r for r in rows if not r["name"].startswith(("time/", "perf/"))]
    return sorted(repr(sorted((k, v) for k, v in r.items() if k not in NOT_COMPARED)) for r in rows)


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_batch_the_schedule_does_not_match_is_refused_before_any_row_is_stored(
    case, prefect_harness, tmp_path, tiny_model_dir, monkeypatch
):
    from flows.train import train

    undone, extra, iteration, expected, held = PLANTED[case]
    config = _config(tiny_model_dir, extra)
    owner = InProcessUpdater if undone == "sync" else RolloutPolicy
    with monkeypatch.context() as planted:
        planted.setattr(owner, undone, lambda self, *args: None)  # the hand-off never made
        with pytest.raises(PolicyVersionError) as caught:
            train(config, data_root=str(tmp_path / "planted"), run_id="v")
    message = str(caught.value)
    assert message.startswith(
        f"iteration {iteration}'s training batch is sampled by the policy after {expected} updates, but its sampler "
        f"holds the weights after {held}: a weight hand-off was missed"
    )
    assert "\n" not in message
    lake = DataLake(tmp_path / "planted")
    trained = lake.read_table("trajectories", "v").to_pylist()
    assert {row["iteration"] for row in trained if row["split"] == "train"} <= set(range(iteration))
    train(config, data_root=str(tmp_path / "planted"), run_id="v")  # resumed, without the fault
    assert lake.read_manifest("v").status == "completed"
    assert ragen_core.train(config, tmp_path / "whole", "v").status == "completed"  # the Python API's door
    for table in ("trajectories", "turns", "evaluations"):
        assert _rows(tmp_path / "planted", "v", table) == _rows(tmp_path / "whole", "v", table), table
