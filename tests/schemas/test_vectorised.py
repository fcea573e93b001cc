"""The vectorised contracts: their building blocks by hand, and agreement with the library reference (pandera +
great-expectations) on bad batches beyond those of test_contracts.py."""

import math

import numpy as np
import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from schemas.contracts import ContractReport, validate_rows, validate_trajectory_batch
from schemas.tables import EVALUATIONS, METRICS
from schemas.vectorised import group_codes, list_stats

GROUP_SIZE = 4
BOUNDS = (-0.1, 1.0)


def test_list_stats_by_hand():
    column = pa.chunked_array(
        [pa.array([[1.0, 2.0, 3.0], None]), pa.array([[], [0.0, None, 5.0], [-1.5, math.nan, math.inf]])]
    )
    stats = list_stats(column)
    assert stats["present"].tolist() == [True, False, True, True, True]
    np.testing.assert_array_equal(stats["length"], [3, np.nan, 0, 3, 3])
    assert stats["nulls"].tolist() == [0, 0, 0, 1, 0]
    np.testing.assert_array_equal(stats["min"], [1.0, np.nan, np.nan, 0.0, -1.5])  # finite elements only
    np.testing.assert_array_equal(stats["max"], [3.0, np.nan, np.nan, 5.0, -1.5])
    assert stats["sum"].tolist() == [6.0, 0.0, 0.0, 5.0, -1.5]
    assert stats["finite"].tolist() == [True, True, True, False, False]  # a null element is not finite


def test_group_codes_by_hand():
    table = pa.table({"a": ["x", "y", "x", None, None], "b": [1.0, 1.0, 1.0, math.nan, None]})
    codes = group_codes(table, ["a", "b"]).tolist()
    # rows 0 and 2 are equal; rows 3 and 4 too (null and NaN are both missing, as in pandas)
    assert codes[0] == codes[2] and codes[3] == codes[4] and len(set(codes)) == 3


def test_merge_adds_only_checks_not_reported_yet():
    ours, theirs = ContractReport(engines=["vectorised"]), ContractReport(engines=["pandera+great_expectations"])
    ours.add("semantics", "group_size", "group_members", [{"row": 1}])
    theirs.add("great_expectations", "group_size", "group_members", [{"row": 1}, {"row": 2}])
    theirs.add("great_expectations", "reward_in_bounds", "total_reward", [{"row": 3}])
    ours.merge(theirs)
    assert [(f["layer"], f["check"]) for f in ours.failures] == [
        ("semantics", "group_size"),
        ("great_expectations", "reward_in_bounds"),
    ]
    assert ours.engines == ["vectorised", "pandera+great_expectations"]
    assert ours.to_dict()["engines"] == ours.engines


def test_an_unknown_engine_is_refused():
    table = pa.Table.from_pylist([], schema=METRICS.arrow_schema)
    with pytest.raises(ValueError, match="unknown contract engine 'fast'; engines: auto, vectorised"):
        validate_rows("metrics", table, engine="fast")


@pytest.fixture(scope="module")
def sokoban_batch(tiny_policy):
    """A multi-turn batch (scripted moves, no log-probs)."""
    _, tokenizer = tiny_policy
    spec = RolloutSpec("sokoban", [3, 4], GROUP_SIZE, max_turns=3, max_actions_per_turn=2, max_actions_per_traj=6)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    meta = BatchMeta(run_id="r", iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="h")
    return trajectories_table(records, meta), turns_table(records, meta)


def _set(table: pa.Table, column: str, row: int, value, kind: pa.DataType | None = None) -> pa.Table:
    values = table[column].to_pylist()
    values[row] = value
    field = table.schema.field(column)
    kind = kind or field.type
    return table.set_column(table.schema.get_field_index(column), pa.field(column, kind), pa.array(values, kind))


def _findings(report: ContractReport) -> dict:
    return {(f["check"], f["column"]): (f["rows"], f["row_count"]) for f in report.failures}


def _both(trajectories, turns, known_difference=(), **kwargs) -> list[str]:
    """Failed checks, after requiring both implementations to find the same failures (rows and counts too), but for
    the ``known_difference`` checks that only the libraries report."""
    vectorised, libraries = (
        validate_trajectory_batch(trajectories, turns, GROUP_SIZE, (-20.0, 20.0), engine=engine, **kwargs)
        for engine in ("vectorised", "libraries")
    )
    reference = {key: found for key, found in _findings(libraries).items() if key[0] not in known_difference}
    assert _findings(vectorised) == reference
    assert sorted(set(libraries.failed_checks()) - set(vectorised.failed_checks())) == sorted(known_difference)
    return vectorised.failed_checks()


def _with(schema: pa.Schema, column: str, kind: pa.DataType) -> pa.Schema:
    return schema.set(schema.get_field_index(column), pa.field(column, kind))


def _fill(table: pa.Table, column: str, value) -> pa.Table:
    kind = table.schema.field(column).type
    return table.set_column(table.schema.get_field_index(column), column, pa.array([value] * table.num_rows, kind))


def _mutations(t: pa.Table, u: pa.Table) -> dict:
    """case -> ((trajectories, turns), keyword arguments, the failed checks computed by hand)."""
    decided = _fill(_fill(t, "kept", True), "group_reward_std", 0.5)
    val, val_turns = _fill(t, "split", "val"), _fill(u, "split", "val")
    return {
        "good multi-turn batch": ((t, u), {}, []),
        "large strings are strings": ((t.cast(_with(t.schema, "env", pa.large_string())), u), {}, []),
        "NaN total reward": ((_set(t, "total_reward", 1, math.nan), u), {}, ["trajectories.total_reward:not_null"]),
        "NaN env reward": ((_set(t, "env_reward", 2, math.nan), u), {}, ["trajectories.env_reward:not_null"]),
        "NaN temperature": (
            (_set(t, "temperature", 0, math.nan), u),
            {},
            ["trajectories.temperature:gt_0", "trajectories.temperature:not_null"],  # NaN is null and fails gt 0
        ),
        "null key": ((_set(t, "group_id", 0, None), u), {}, ["trajectories.group_id:not_null"]),
        "key column missing": (
            (t.drop_columns(["traj_index"]), u),
            {"known_difference": ("trajectories:unique_key",)},
            ["trajectories:missing_column"],
        ),
        "column of null type": (
            (t.set_column(t.schema.get_field_index("env"), "env", pa.nulls(t.num_rows)), u),
            {"known_difference": ("trajectories.env:not_null",)},
            ["trajectories.env:dtype"],
        ),
        "int64 token ids": (
            (_set(t, "input_ids", 0, [1, 2], pa.list_(pa.int64())), u),
            {},
            ["trajectories.input_ids:dtype"],
        ),
        "bad turn split": ((t, _set(u, "split", 0, "test")), {}, ["turns.split:isin"]),
        "val rows filtered": (
            (_fill(val, "kept", True), val_turns),
            {"filtered": True},
            ["val_rows_have_no_filter_decision"],
        ),
        "NaN std breaks ge 0": (
            (_fill(decided, "group_reward_std", math.nan), u),
            {"filtered": True},
            ["trajectories.group_reward_std:ge_0"],
        ),
        "kept missing after the filter": (
            (_set(decided, "kept", 2, None), u),
            {"filtered": True},
            ["filter_decision_constant_in_group", "train_rows_have_filter_decision"],
        ),
        "std differs in group": (
            (_set(decided, "group_reward_std", 7, 0.25), u),
            {"filtered": True},
            ["filter_decision_constant_in_group"],
        ),
        "turns of another run": (
            (t, _fill(u, "run_id", "other")),
            {},
            ["turn_count_matches", "turns_belong_to_trajectories"],
        ),
        "empty batch": ((t.slice(0, 0), u.slice(0, 0)), {}, []),
    }


CASES = (
    "good multi-turn batch",
    "large strings are strings",
    "NaN total reward",
    "NaN env reward",
    "NaN temperature",
    "null key",
    "key column missing",
    "column of null type",
    "int64 token ids",
    "bad turn split",
    "val rows filtered",
    "NaN std breaks ge 0",
    "kept missing after the filter",
    "std differs in group",
    "turns of another run",
    "empty batch",
)


@pytest.mark.parametrize("case", CASES)
def test_both_implementations_agree(sokoban_batch, case):
    (trajectories, turns), kwargs, expected = _mutations(*sokoban_batch)[case]
    assert _both(trajectories, turns, **kwargs) == expected
    report = validate_trajectory_batch(
        trajectories, turns, GROUP_SIZE, (-20.0, 20.0), **{k: v for k, v in kwargs.items() if k != "known_difference"}
    )
    # the default engine: the vectorised checks, and the libraries' second opinion merged in on a rejected batch
    assert report.failed_checks() == sorted(set(expected) | set(kwargs.get("known_difference", ())))
    assert report.engines == (["vectorised", "pandera+great_expectations"] if expected else ["vectorised"])


def test_small_tables_agree_too():
    row = {
        "run_id": "r",
        "iteration": 0,
        "env": "bandit",
        "instances": 4,
        "k": 1,
        "temperature": 0.5,
        "success_rate": math.nan,
        "pass_at_k": 0.5,
        "reward_mean": 0.1,
        "response_length_mean": None,
    }
    table = pa.Table.from_pylist([row, {**row, "env": "sokoban", "k": 0}], schema=EVALUATIONS.arrow_schema)
    reports = [validate_rows("evaluations", table, engine=engine) for engine in ("vectorised", "libraries")]
    assert _findings(reports[0]) == _findings(reports[1])
    assert reports[0].failed_checks() == [
        "evaluations.k:ge_1",
        "evaluations.response_length_mean:not_null",
        "evaluations.success_rate:between_0_1",  # a NaN is null and fails the range
        "evaluations.success_rate:not_null",
    ]
    auto = validate_rows("evaluations", table)
    assert auto.engines == ["vectorised", "pandera+great_expectations"] and _findings(auto) == _findings(reports[0])


def test_a_library_crash_does_not_stop_the_rejection(sokoban_batch):
    trajectories, turns = sokoban_batch
    structs = pa.array([{"name": "sokoban"}] * trajectories.num_rows)
    bad = trajectories.set_column(trajectories.schema.get_field_index("env"), "env", structs)  # a key column
    with pytest.raises(pa.ArrowNotImplementedError):  # pandera cannot test the key's uniqueness
        validate_trajectory_batch(bad, turns, GROUP_SIZE, BOUNDS, engine="libraries")
    report = validate_trajectory_batch(bad, turns, GROUP_SIZE, BOUNDS)
    assert report.failed_checks() == ["trajectories.env:dtype"] and report.engines == ["vectorised"]
    assert report.reference_error.startswith("ArrowNotImplementedError")
    assert report.to_dict()["reference_error"] == report.reference_error
