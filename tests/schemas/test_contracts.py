import math

import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.storage import BatchMeta, trajectories_table, turns_table
from schemas.contracts import validate_trajectory_batch

GROUP_SIZE = 4
BOUNDS = (-0.1, 1.0)


@pytest.fixture(scope="module")
def batch(tiny_policy):
    model, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], GROUP_SIZE, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 12), ChatFormatter(tokenizer), seed=0)
    meta = BatchMeta("r", 0, "train", 0, 1.0, "h")
    return trajectories_table(records, meta), turns_table(records, meta)


def _replace(table: pa.Table, column: str, values) -> pa.Table:
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(column), pa.array(values, table.schema.field(column).type))


def test_a_good_batch_passes(batch):
    report = validate_trajectory_batch(*batch, GROUP_SIZE, BOUNDS)
    assert report.ok, report.to_json()


def test_wrong_type_is_caught_by_pandera(batch):
    trajectories, turns = batch
    index = trajectories.schema.get_field_index("env_seed")
    bad = trajectories.set_column(index, "env_seed", trajectories["env_seed"].cast(pa.float64()))
    report = validate_trajectory_batch(bad, turns, GROUP_SIZE, BOUNDS)
    assert [f["layer"] for f in report.failures] == ["pandera"] and report.failures[0]["column"] == "env_seed"


def test_length_mismatch(batch):
    trajectories, turns = batch
    masks = trajectories["loss_mask"].to_pylist()
    masks[3] = masks[3][:-1]
    report = validate_trajectory_batch(_replace(trajectories, "loss_mask", masks), turns, GROUP_SIZE, BOUNDS)
    assert "expect_column_pair_values_to_be_equal[n_input_ids,n_loss_mask]" in report.failed_checks()
    assert report.failures[0]["rows"] == [["r", 0, "train", "bandit", 0, 3]]


def test_nan_logprob(batch):
    trajectories, turns = batch
    logprobs = trajectories["behavior_logprobs"].to_pylist()
    logprobs[0][-1] = math.nan
    report = validate_trajectory_batch(
        _replace(trajectories, "behavior_logprobs", logprobs), turns, GROUP_SIZE, BOUNDS
    )
    assert "expect_column_values_to_be_in_set[logprobs_finite]" in report.failed_checks()


def test_reward_out_of_range(batch):
    trajectories, turns = batch
    rewards = trajectories["total_reward"].to_pylist()
    rewards[1] = 5.0
    env_rewards = trajectories["env_reward"].to_pylist()
    env_rewards[1] = 5.0 - trajectories["format_penalty"][1].as_py()
    bad = _replace(_replace(trajectories, "total_reward", rewards), "env_reward", env_rewards)
    report = validate_trajectory_batch(bad, turns, GROUP_SIZE, BOUNDS)
    assert report.failed_checks() == ["expect_column_values_to_be_between[total_reward]"]


def test_duplicate_key(batch):
    trajectories, turns = batch
    index = trajectories["traj_index"].to_pylist()
    index[1] = index[0]
    report = validate_trajectory_batch(_replace(trajectories, "traj_index", index), turns, GROUP_SIZE, BOUNDS)
    assert any("unique" in check for check in report.failed_checks())


def test_wrong_group_size(batch):
    trajectories, turns = batch
    report = validate_trajectory_batch(trajectories.slice(0, 7), turns.slice(0, 7), GROUP_SIZE, BOUNDS)
    assert report.failed_checks() == ["expect_column_values_to_be_in_set[group_members]"]


def test_policy_rows_must_carry_logprobs(batch):
    trajectories, turns = batch
    logprobs = trajectories["behavior_logprobs"].to_pylist()
    logprobs[2] = None
    report = validate_trajectory_batch(
        _replace(trajectories, "behavior_logprobs", logprobs), turns, GROUP_SIZE, BOUNDS
    )
    assert "expect_column_values_to_not_be_null[n_logprobs]" in report.failed_checks()
