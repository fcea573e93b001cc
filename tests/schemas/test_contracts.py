import math
import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from schemas.contracts import validate_rows, validate_trajectory_batch
from schemas.suites import SEMANTIC_CHECKS

GROUP_SIZE = 4
BOUNDS = (-0.1, 1.0)
STRUCTURE_CHECK = re.compile(r"^[a-z_]+(\.[a-z_]+)?:[a-z_0-9]+$")


@pytest.fixture(scope="module")
def batch(tiny_policy):
    model, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], GROUP_SIZE, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 12), ChatFormatter(tokenizer), seed=0)
    meta = BatchMeta(run_id="r", iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="h")
    return trajectories_table(records, meta), turns_table(records, meta)


def _replace(table: pa.Table, column: str, values) -> pa.Table:
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(column), pa.array(values, table.schema.field(column).type))


def _edit(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table[column].to_pylist()
    values[row] = value(values[row]) if callable(value) else value
    return _replace(table, column, values)


def _findings(report) -> dict:
    return {(f["check"], f["column"]): (f["rows"], f["row_count"]) for f in report.failures}


def _check(trajectories, turns, **kwargs):
    """The batch's report, after checking that both implementations find the same failures, rows and all. A passing
    batch also goes through the default (auto) engine, which must run the vectorised checks alone; on a rejected
    batch auto runs exactly these two and merges them (tests/schemas/test_vectorised.py checks the merge on every
    kind of bad batch), so the vectorised report stands for it here and the libraries' ~1 s is not spent twice."""
    vectorised, libraries = (
        validate_trajectory_batch(trajectories, turns, GROUP_SIZE, BOUNDS, engine=engine, **kwargs)
        for engine in ("vectorised", "libraries")
    )
    assert _findings(vectorised) == _findings(libraries)
    report = vectorised
    if vectorised.ok:
        report = validate_trajectory_batch(trajectories, turns, GROUP_SIZE, BOUNDS, **kwargs)
        assert report.ok and report.engines == ["vectorised"]
    for name in report.failed_checks():  # every reported name is one of the documented, stable names
        assert name in SEMANTIC_CHECKS or STRUCTURE_CHECK.match(name), name
    return report


def _key(traj_index: int, group_id: int = 0) -> dict:
    return {
        "run_id": "r",
        "iteration": 0,
        "split": "train",
        "env": "bandit",
        "group_id": group_id,
        "traj_index": traj_index,
    }


def test_a_good_batch_passes(batch):
    report = _check(*batch)
    assert report.ok, report.to_json()


def test_a_scripted_batch_without_logprobs_passes(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], GROUP_SIZE, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    meta = BatchMeta(run_id="r", iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="h")
    trajectories = trajectories_table(records, meta)
    assert trajectories["behavior_logprobs"].null_count == trajectories.num_rows
    report = _check(trajectories, turns_table(records, meta))
    assert report.ok, report.to_json()


def test_wrong_type_is_caught(batch):
    trajectories, turns = batch
    index = trajectories.schema.get_field_index("env_seed")
    bad = trajectories.set_column(index, "env_seed", trajectories["env_seed"].cast(pa.float64()))
    report = _check(bad, turns)
    assert report.failed_checks() == ["trajectories.env_seed:dtype"]
    assert [f["layer"] for f in report.failures] == ["structure"] and report.failures[0]["column"] == "env_seed"


def test_null_and_range_failures_name_the_rows(batch):
    trajectories, turns = batch
    bad = _edit(_edit(trajectories, "num_turns", 5, 0), "success", 2, None)
    report = _check(bad, turns)
    assert report.failed_checks() == ["trajectories.num_turns:ge_1", "trajectories.success:not_null"]
    rows = {f["check"]: f["rows"] for f in report.failures}
    assert rows["trajectories.num_turns:ge_1"] == [_key(1, group_id=1)]
    assert rows["trajectories.success:not_null"] == [_key(2)]


def test_missing_and_unexpected_columns(batch):
    trajectories, turns = batch
    bad = trajectories.drop_columns(["num_actions"]).append_column("extra", pa.array([1] * trajectories.num_rows))
    report = _check(bad, turns)
    assert report.failed_checks() == ["trajectories:missing_column", "trajectories:unexpected_column"]
    assert {f["column"] for f in report.failures} == {"num_actions", "extra"}


def test_length_mismatch(batch):
    trajectories, turns = batch
    report = _check(_edit(trajectories, "input_ids", 3, lambda ids: ids + [5]), turns)
    assert report.failed_checks() == ["logprobs_length_matches_input_ids", "loss_mask_length_matches_input_ids"]
    assert all(f["rows"] == [_key(3)] for f in report.failures)


def test_nan_and_positive_logprobs(batch):
    trajectories, turns = batch
    nan = _edit(trajectories, "behavior_logprobs", 0, lambda lp: lp[:-1] + [math.nan])
    assert _check(nan, turns).failed_checks() == ["logprobs_finite"]
    positive = _edit(trajectories, "behavior_logprobs", 1, lambda lp: lp[:-1] + [0.5])
    report = _check(positive, turns)
    assert report.failed_checks() == ["logprobs_non_positive"] and report.failures[0]["rows"] == [_key(1)]


def test_token_list_elements(batch):
    trajectories, turns = batch
    assert _check(_edit(trajectories, "loss_mask", 0, lambda m: m[:-1] + [2]), turns).failed_checks() == [
        "loss_mask_is_binary",
        "response_length_matches_mask",
    ]
    assert _check(_edit(trajectories, "input_ids", 0, lambda i: [-1] + i[1:]), turns).failed_checks() == [
        "input_ids_non_negative"
    ]
    assert _check(_edit(trajectories, "input_ids", 0, lambda i: [None] + i[1:]), turns).failed_checks() == [
        "token_lists_have_no_null_elements"
    ]


def test_every_trajectory_needs_a_trained_token(batch):
    trajectories, turns = batch
    report = _check(_edit(trajectories, "loss_mask", 6, lambda m: [0] * len(m)), turns)
    assert report.failed_checks() == ["has_trained_token", "response_length_matches_mask"]


def test_reward_out_of_range(batch):
    trajectories, turns = batch
    penalty = trajectories["format_penalty"][1].as_py()
    bad = _edit(_edit(trajectories, "total_reward", 1, 5.0), "env_reward", 1, 5.0 - penalty)
    report = _check(bad, turns)
    assert report.failed_checks() == ["reward_in_bounds"] and report.failures[0]["rows"] == [_key(1)]


def test_reward_parts_must_sum(batch):
    trajectories, turns = batch
    report = _check(_edit(trajectories, "env_reward", 0, lambda r: r + 0.25), turns)
    assert report.failed_checks() == ["reward_parts_sum"]


def test_duplicate_key(batch):
    trajectories, turns = batch
    report = _check(_edit(trajectories, "traj_index", 1, 0), turns)
    assert report.failed_checks() == ["trajectories:unique_key"]
    assert report.failures[0]["rows"] == [_key(0), _key(0)]


def test_wrong_group_size(batch):
    trajectories, turns = batch
    report = _check(trajectories.slice(0, 7), turns.slice(0, 7))
    assert report.failed_checks() == ["group_size"]
    assert report.failures[0]["rows"] == [_key(i, group_id=1) for i in range(3)]


def test_seeds_must_be_equal_within_a_group(batch):
    trajectories, turns = batch
    report = _check(_edit(trajectories, "env_seed", 2, lambda s: s + 1), turns)
    assert report.failed_checks() == ["group_seed_shared"]
    assert report.failures[0]["rows"] == [_key(i) for i in range(GROUP_SIZE)]


def test_policy_rows_must_carry_logprobs_scripted_rows_may_not(batch):
    trajectories, turns = batch
    no_logprobs = _edit(trajectories, "behavior_logprobs", 2, None)
    assert _check(no_logprobs, turns).failed_checks() == ["policy_rows_have_logprobs"]
    assert _check(_edit(no_logprobs, "behavior_source", 2, "scripted"), turns).ok


def test_turn_counts_match_and_turns_belong_to_trajectories(batch):
    trajectories, turns = batch
    assert _check(trajectories, turns.slice(1)).failed_checks() == ["turn_count_matches"]
    report = _check(trajectories, _edit(turns, "group_id", 0, 7))
    assert report.failed_checks() == ["turn_count_matches", "turns_belong_to_trajectories"]
    orphan = next(f for f in report.failures if f["check"] == "turns_belong_to_trajectories")
    assert orphan["rows"] == [_key(0, group_id=7)]


def test_success_rule_is_optional_and_checked_when_given(batch):
    trajectories, turns = batch
    consistent = _replace(trajectories, "success", pc.greater(trajectories["env_reward"], 0).to_pylist())
    assert _check(consistent, turns, success_rule=lambda reward: reward > 0).ok
    flipped = _edit(consistent, "success", 4, lambda s: not s)
    assert _check(flipped, turns).ok  # no rule: success is not tied to the reward
    report = _check(flipped, turns, success_rule=lambda reward: reward > 0)
    assert report.failed_checks() == ["success_matches_reward"] and report.failures[0]["rows"] == [_key(0, 1)]
    assert _check(flipped, turns, success_rule=lambda reward: None).ok  # the rule may imply nothing


def test_filter_columns_follow_the_split_and_the_filter(batch):
    trajectories, turns = batch
    n = trajectories.num_rows
    assert _check(_edit(trajectories, "kept", 0, True), turns).failed_checks() == ["train_rows_unfiltered"]
    assert _check(trajectories, turns, filtered=True).failed_checks() == ["train_rows_have_filter_decision"]
    decided = _replace(_replace(trajectories, "kept", [True] * 4 + [False] * 4), "group_reward_std", [0.5] * n)
    assert _check(decided, turns, filtered=True).ok
    split_group = _edit(decided, "kept", 0, False)
    assert _check(split_group, turns, filtered=True).failed_checks() == ["filter_decision_constant_in_group"]
    val = _replace(trajectories, "split", ["val"] * n)
    val_turns = _replace(turns, "split", ["val"] * turns.num_rows)
    assert _check(val, val_turns).ok and _check(val, val_turns, filtered=True).ok
    report = _check(_edit(val, "kept", 3, False), val_turns, filtered=True)
    assert report.failed_checks() == ["val_rows_have_no_filter_decision"]


def test_small_tables_have_structure_contracts():
    evaluation = {
        "run_id": "r",
        "iteration": 0,
        "env": "bandit",
        "instances": 4,
        "k": 1,
        "temperature": 0.5,
        "success_rate": 1.5,
        "pass_at_k": 0.5,
        "reward_mean": 0.1,
        "response_length_mean": 3.0,
    }
    from schemas.tables import CHECKPOINTS, EVALUATIONS, EVENTS

    report = validate_rows("evaluations", pa.Table.from_pylist([evaluation], schema=EVALUATIONS.arrow_schema))
    assert report.failed_checks() == ["evaluations.success_rate:between_0_1"]
    checkpoint = {
        "run_id": "r",
        "iteration": 1,
        "format": "zip",
        "path": "/x",
        "metrics_json": "{}",
        "created_at": None,
    }
    report = validate_rows("checkpoints", pa.Table.from_pylist([checkpoint], schema=CHECKPOINTS.arrow_schema))
    assert report.failed_checks() == ["checkpoints.created_at:not_null", "checkpoints.format:isin"]
    event = {
        "run_id": "r",
        "iteration": 1,
        "kind": "early_warning",
        "metric": None,
        "value": None,
        "threshold": None,
        "message": "m",
        "created_at": 0,
    }
    report = validate_rows("events", pa.Table.from_pylist([event, event], schema=EVENTS.arrow_schema))
    assert report.failed_checks() == ["events:unique_key"]


def test_a_row_older_than_the_staleness_bound_or_newer_than_its_iteration_fails(batch):
    trajectories, turns = batch
    # the batch is iteration 0, version 0; moved to iteration 3 its rows are 3 updates stale
    stale = _replace(trajectories, "iteration", [3] * trajectories.num_rows)
    moved_turns = _replace(turns, "iteration", [3] * turns.num_rows)
    assert _check(stale, moved_turns, max_staleness=3).ok
    report = _check(stale, moved_turns, max_staleness=2)
    rows, count = _findings(report)[("policy_version_within_staleness", "staleness")]
    assert count == trajectories.num_rows and report.failed_checks() == ["policy_version_within_staleness"]
    # one row sampled by a policy newer than its iteration (version 1 at iteration 0) fails even unbounded
    report = _check(_edit(trajectories, "policy_version", 2, 1), turns, max_staleness=5)
    assert _findings(report)[("policy_version_within_staleness", "staleness")] == ([_key(2)], 1)
