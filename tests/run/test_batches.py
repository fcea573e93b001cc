"""The batch pipeline on a real lake (stage -> validate -> publish, marked done): what readers see at each step, the
done marker a resume reuses, and the order it enforces. The quarantine of each kind of bad batch is
tests/storage/test_quarantine.py's."""

from __future__ import annotations

import statistics

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.config import AlgorithmConfig
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta
from ragen_core.run.batches import BatchPipeline, BatchRejected, BatchRules
from ragen_core.storage import DataLake, Stage

RUN, GROUP_SIZE = "batches", 3


@pytest.fixture(scope="module")
def records(tiny_policy):
    """Two groups of three scripted bandit rollouts."""
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [4, 5], GROUP_SIZE, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=1)


def _pipeline(lake: DataLake, iteration: int = 0, group_size: int = GROUP_SIZE) -> BatchPipeline:
    meta = BatchMeta.training(RUN, iteration, 1.0, "hash")
    return BatchPipeline(lake, meta, Stage.ROLLOUT, BatchRules(group_size, (-1.0, 1.0)))


def test_a_batch_is_invisible_until_published_and_then_marked_done_with_its_metrics(tmp_path, records):
    lake = DataLake(tmp_path)
    pipeline = _pipeline(lake)
    assert pipeline.persist(records) == {"trajectories": 6, "turns": sum(len(r.turns) for r in records)}
    assert lake.read_table("trajectories", RUN, 0).num_rows == 0 and lake.finished_stages(RUN, 0) == []
    assert pipeline.validate() == {"rows": 6, "checks": "passed"}
    assert lake.read_table("trajectories", RUN, 0).num_rows == 0  # checked, still staged
    metrics = pipeline.publish(lambda trajectories, turns: {"rows": float(trajectories.num_rows)})
    assert metrics == {"rows": 6.0}
    assert lake.read_table("trajectories", RUN, 0).num_rows == 6
    assert lake.finished_stages(RUN, 0) == [Stage.ROLLOUT]
    assert lake.stage_result(RUN, 0, Stage.ROLLOUT) == {"metrics": {"rows": 6.0}}
    assert lake.discard_uncommitted(RUN, 0) == [Stage.ROLLOUT]  # a re-run of the iteration reuses the stage
    assert lake.read_table("trajectories", RUN, 0).num_rows == 6


def test_run_is_the_three_steps_and_publishes_no_metrics_unless_asked(tmp_path, records):
    lake = DataLake(tmp_path)
    assert _pipeline(lake).run(records) == {}
    assert lake.stage_result(RUN, 0, Stage.ROLLOUT) == {"metrics": {}}
    seeds = lake.read_table("trajectories", RUN, 0, columns=["group_id", "env_seed"]).to_pylist()
    assert sorted({(row["group_id"], row["env_seed"]) for row in seeds}) == [(0, 4), (1, 5)]


def test_nothing_is_filtered_or_measured_and_published_before_validation(tmp_path, records):
    lake = DataLake(tmp_path)
    pipeline = _pipeline(lake)
    pipeline.persist(records)
    with pytest.raises(RuntimeError, match=r"BatchPipeline\(batches/0/rollout\) has not been validated"):
        pipeline.publish(lambda trajectories, turns: {})
    with pytest.raises(RuntimeError, match="has not been validated"):
        pipeline.filter(AlgorithmConfig())
    assert lake.finished_stages(RUN, 0) == [] and lake.read_table("trajectories", RUN, 0).num_rows == 0


def test_a_rejected_batch_is_never_marked_done_and_leaves_nothing_to_reuse(tmp_path, records):
    lake = DataLake(tmp_path)
    pipeline = _pipeline(lake, group_size=2)  # groups of 3 against a rule of 2
    pipeline.persist(records)
    with pytest.raises(BatchRejected, match="failed checks group_size") as rejected:
        pipeline.validate()
    assert rejected.value.quarantine == str(lake.quarantine_dir(RUN, 0, Stage.ROLLOUT))
    with pytest.raises(RuntimeError, match="has not been validated"):
        pipeline.checked()
    assert lake.finished_stages(RUN, 0) == [] and lake.discard_uncommitted(RUN, 0) == []


def test_a_redo_of_a_stage_overwrites_its_staged_batch(tmp_path, records):
    """Deterministic names: a stage redone after a crash before its publish replaces what it staged."""
    lake = DataLake(tmp_path)
    _pipeline(lake).persist(records[:3])
    pipeline = _pipeline(lake)
    pipeline.persist(records)
    pipeline.validate()
    assert lake.read_staged(RUN, 0, Stage.ROLLOUT, "turns").num_rows == sum(len(r.turns) for r in records)
    pipeline.publish()
    assert lake.read_table("trajectories", RUN, 0).num_rows == 6


def test_the_trajectories_are_written_once_with_the_filter_s_columns(tmp_path, records):
    """persist stages the turns only; validate and filter write nothing; publish stages the filtered trajectories
    (the one write of them) and renames both tables into place."""
    lake = DataLake(tmp_path)
    pipeline = _pipeline(lake)
    pipeline.persist(records)
    staged = lake.stage_dir(RUN, 0, Stage.ROLLOUT)
    assert sorted(p.parent.name for p in staged.rglob("*.parquet")) == ["turns"]
    pipeline.validate()
    pipeline.filter(AlgorithmConfig(filter_ratio=0.5))  # keeps the group with the larger reward spread
    assert sorted(p.parent.name for p in staged.rglob("*.parquet")) == ["turns"]
    pipeline.publish()
    (part,) = lake.partition_files("trajectories", RUN, 0)
    rows = lake.read_table("trajectories", RUN, 0).to_pylist()
    for group in (0, 1):  # the filter's columns, as the filter computed them: each group's sample std of rewards
        rewards = [row["total_reward"] for row in rows if row["group_id"] == group]
        spreads = [row["group_reward_std"] for row in rows if row["group_id"] == group]
        assert spreads == pytest.approx([statistics.stdev(rewards)] * len(rewards))
    assert len({row["group_id"] for row in rows if row["kept"]}) == 1  # half of the two groups
