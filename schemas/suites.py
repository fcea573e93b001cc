"""Layer 2 of the data contracts, library reference: a great-expectations suite over a per-trajectory summary frame.

:mod:`schemas.vectorised` computes the same checks on the Arrow batch and runs on every batch; this suite re-checks
the batches it rejects (and every batch with ``engine="libraries"`` or ``"both"``).

The frame holds one row per trajectory with lengths, sums and flags derived from the token lists (never the
lists themselves), so the suite stays fast and its reports stay readable. Every expectation carries its stable
check name in ``meta["check"]``; :data:`SEMANTIC_CHECKS` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import TOOL_ERRORS, TRAJECTORIES, TRAJECTORY_KEY

SEMANTIC_CHECKS = (
    "loss_mask_length_matches_input_ids",
    "logprobs_length_matches_input_ids",
    "token_lists_have_no_null_elements",
    "loss_mask_is_binary",
    "input_ids_non_negative",
    "has_trained_token",
    "response_length_matches_mask",
    "logprobs_finite",
    "logprobs_non_positive",
    "policy_rows_have_logprobs",
    "reward_in_bounds",
    "reward_parts_sum",
    "success_matches_reward",
    "group_size",
    "group_seed_shared",
    "unique_trajectory_key",
    "turn_count_matches",
    "turns_belong_to_trajectories",
    "val_rows_have_no_filter_decision",
    "train_rows_unfiltered",
    "train_rows_have_filter_decision",
    "filter_decision_constant_in_group",
    "policy_version_within_staleness",
    "tool_calls_consistent",
)
GROUP_COLUMNS = ["run_id", "iteration", "split", "env", "group_id"]
REWARD_TOLERANCE = 1e-6


def _list_stats(column: pa.ChunkedArray, num_rows: int) -> pd.DataFrame:
    """Per row of a list column: length (NaN for a null list), null elements, min, max, sum and all-finite."""
    array = column.combine_chunks()
    flat = pc.list_flatten(array)
    parents = pc.list_parent_indices(array)
    values = flat.cast(pa.float64())
    finite = pc.fill_null(pc.is_finite(values), False)
    elements = pa.table(
        {"row": parents, "v": pc.if_else(finite, values, None), "null": pc.is_null(flat), "finite": finite}
    )
    grouped = elements.group_by("row").aggregate(
        [("v", "min"), ("v", "max"), ("v", "sum"), ("null", "sum"), ("finite", "all")]
    )
    stats = pd.DataFrame(index=pd.RangeIndex(num_rows))
    rows = grouped["row"].to_numpy()
    for source, target, fill in (
        ("v_min", "min", np.nan),
        ("v_max", "max", np.nan),
        ("v_sum", "sum", 0.0),
        ("null_sum", "nulls", 0.0),
    ):
        out = np.full(num_rows, fill, dtype="float64")
        out[rows] = grouped[source].to_numpy(zero_copy_only=False).astype("float64")
        stats[target] = out
    finite_all = np.full(num_rows, True, dtype=object)
    finite_all[rows] = grouped["finite_all"].to_pylist()
    stats["finite"] = finite_all
    lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
    stats["length"] = np.asarray(lengths, dtype="float64")  # NaN where the list is null
    is_null = array.is_null().to_numpy(zero_copy_only=False)
    stats.loc[is_null, "finite"] = None
    return stats


def trajectory_summary(
    trajectories: pa.Table,
    turns: pa.Table | None,
    success_rule: Callable[[float], bool | None] | None = None,
) -> pd.DataFrame:
    """Per-trajectory summary frame (lengths, sums, flags) for the semantic checks; no raw token lists."""
    lists = ("input_ids", "loss_mask", "behavior_logprobs", "segment_lengths")
    scalar = [c for c in TRAJECTORIES.column_names if c not in lists]
    frame = trajectories.select(scalar).to_pandas()
    n = trajectories.num_rows
    ids, mask, logprobs = (_list_stats(trajectories[c], n) for c in ("input_ids", "loss_mask", "behavior_logprobs"))
    frame["n_input_ids"], frame["n_loss_mask"], frame["n_logprobs"] = ids["length"], mask["length"], logprobs["length"]
    frame["n_null_tokens"] = ids["nulls"] + mask["nulls"] + logprobs["nulls"]
    frame["mask_binary"] = ~((mask["min"] < 0) | (mask["max"] > 1))
    frame["min_input_id"] = ids["min"]
    frame["n_trained"] = mask["sum"]
    frame["max_logprob"] = logprobs["max"]
    frame["logprobs_finite"] = logprobs["finite"]
    frame["is_policy"] = frame["behavior_source"] == "policy"
    frame["staleness"] = frame["iteration"].astype("int64") - frame["policy_version"].astype("int64")
    frame["reward_parts_gap"] = (frame["total_reward"] - (frame["env_reward"] + frame["format_penalty"])).abs()
    groups = frame.groupby(GROUP_COLUMNS, dropna=False)
    frame["group_members"] = groups["traj_index"].transform("size")
    frame["group_seeds"] = groups["env_seed"].transform("nunique")
    frame["group_kept_values"] = groups["kept"].transform(lambda s: s.nunique(dropna=False))
    frame["group_std_values"] = groups["group_reward_std"].transform(lambda s: s.nunique(dropna=False))
    if success_rule is not None:
        frame["success_expected"] = pd.Series([success_rule(float(r)) for r in frame["env_reward"]], dtype=object)
    if turns is not None:
        counts = turns.select(list(TRAJECTORY_KEY)).to_pandas().value_counts().rename("turn_rows").reset_index()
        frame = frame.merge(counts, on=list(TRAJECTORY_KEY), how="left")
        frame["turn_rows"] = frame["turn_rows"].fillna(0)
        frame = frame.merge(_bad_tool_turns(turns), on=list(TRAJECTORY_KEY), how="left")
        frame["bad_tool_turns"] = frame["bad_tool_turns"].fillna(0)
    return frame


_RAN = (None, "raised", "timeout")  # the errors of a call whose tool ran


def tool_calls_problem(calls: list[dict[str, Any]] | None, actions: list[str] | None) -> bool:
    """Whether a turn's ``tool_calls`` break the rules of the column: an error named in
    :data:`~schemas.tables.TOOL_ERRORS` (or none), a name unless the call did not parse, a result and arguments,
    finite non-negative seconds that are 0 for a call that did not run, and as many calls that ran as the turn has
    actions. A null list (an env without tools) breaks none."""
    if calls is None:
        return False
    ran = 0
    for call in calls:
        error, seconds = call["error"], call["duration_s"]
        if error is not None and error not in TOOL_ERRORS or call["name"] is None and error != "bad_json":
            return True
        if call["result"] is None or call["arguments"] is None or seconds is None or not np.isfinite(seconds):
            return True
        if seconds < 0 or error not in _RAN and seconds != 0:
            return True
        ran += error in _RAN
    return ran != len(actions or [])


def _bad_tool_turns(turns: pa.Table) -> pd.DataFrame:
    """Per trajectory key, how many of its turns break :func:`tool_calls_problem`."""
    keys = list(TRAJECTORY_KEY)
    frame = turns.select(keys).to_pandas()
    calls = turns["tool_calls"].to_pylist() if "tool_calls" in turns.column_names else [None] * turns.num_rows
    actions = turns["actions"].to_pylist()
    frame["bad_tool_turns"] = [int(tool_calls_problem(c, a)) for c, a in zip(calls, actions, strict=True)]
    return frame.groupby(keys, dropna=False, as_index=False)["bad_tool_turns"].sum()


@lru_cache(maxsize=1)
def _gx_batch_definition():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("ragen").add_dataframe_asset(name="trajectory_summary")
    return asset.add_batch_definition_whole_dataframe("batch")


def _expectations(
    group_size: int, reward_bounds: tuple[float, float], max_staleness: int = 0
) -> list[tuple[str, Any]]:
    """The checks every trajectory batch gets."""
    import great_expectations.expectations as gxe

    low, high = reward_bounds
    pair, between = gxe.ExpectColumnPairValuesToBeEqual, gxe.ExpectColumnValuesToBeBetween
    in_set = gxe.ExpectColumnValuesToBeInSet
    val = {"row_condition": 'split=="val"', "condition_parser": "pandas"}
    return [
        ("loss_mask_length_matches_input_ids", pair(column_A="n_input_ids", column_B="n_loss_mask")),
        (
            "logprobs_length_matches_input_ids",
            pair(column_A="n_input_ids", column_B="n_logprobs", ignore_row_if="either_value_is_missing"),
        ),
        ("token_lists_have_no_null_elements", in_set(column="n_null_tokens", value_set=[0])),
        ("loss_mask_is_binary", in_set(column="mask_binary", value_set=[True])),
        ("input_ids_non_negative", between(column="min_input_id", min_value=0)),
        ("has_trained_token", between(column="n_trained", min_value=1)),
        ("response_length_matches_mask", pair(column_A="response_length", column_B="n_trained")),
        ("logprobs_finite", in_set(column="logprobs_finite", value_set=[True])),
        ("logprobs_non_positive", between(column="max_logprob", max_value=0.0)),
        (
            "policy_rows_have_logprobs",
            gxe.ExpectColumnValuesToNotBeNull(
                column="n_logprobs", row_condition="is_policy==True", condition_parser="pandas"
            ),
        ),
        ("reward_in_bounds", between(column="total_reward", min_value=low - 1e-9, max_value=high + 1e-9)),
        ("reward_parts_sum", between(column="reward_parts_gap", max_value=REWARD_TOLERANCE)),
        ("group_size", in_set(column="group_members", value_set=[group_size])),
        ("group_seed_shared", in_set(column="group_seeds", value_set=[1])),
        ("unique_trajectory_key", gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TRAJECTORY_KEY))),
        ("val_rows_have_no_filter_decision", gxe.ExpectColumnValuesToBeNull(column="kept", **val)),
        ("val_rows_have_no_filter_decision", gxe.ExpectColumnValuesToBeNull(column="group_reward_std", **val)),
        ("policy_version_within_staleness", between(column="staleness", min_value=0, max_value=max_staleness)),
    ]


def _optional_expectations(with_turns: bool, with_success: bool, filtered: bool) -> list[tuple[str, Any]]:
    """The checks that depend on what the caller passes: turns, a success rule, the filter having run."""
    import great_expectations.expectations as gxe

    pair, in_set = gxe.ExpectColumnPairValuesToBeEqual, gxe.ExpectColumnValuesToBeInSet
    train = {"row_condition": 'split=="train"', "condition_parser": "pandas"}
    items = []
    if with_success:
        success = pair(column_A="success", column_B="success_expected", ignore_row_if="either_value_is_missing")
        items.append(("success_matches_reward", success))
    if with_turns:
        items.append(("turn_count_matches", pair(column_A="num_turns", column_B="turn_rows")))
        items.append(("tool_calls_consistent", in_set(column="bad_tool_turns", value_set=[0])))
    if filtered:
        items += [
            ("train_rows_have_filter_decision", gxe.ExpectColumnValuesToNotBeNull(column="kept", **train)),
            ("train_rows_have_filter_decision", gxe.ExpectColumnValuesToNotBeNull(column="group_reward_std", **train)),
            ("filter_decision_constant_in_group", in_set(column="group_kept_values", value_set=[1], **train)),
            ("filter_decision_constant_in_group", in_set(column="group_std_values", value_set=[1], **train)),
        ]
    else:
        items += [
            ("train_rows_unfiltered", gxe.ExpectColumnValuesToBeNull(column="kept", **train)),
            ("train_rows_unfiltered", gxe.ExpectColumnValuesToBeNull(column="group_reward_std", **train)),
        ]
    return items


@lru_cache(maxsize=32)  # built once per run and kind of batch; validation does not change a suite
def trajectory_suite(
    group_size: int,
    reward_bounds: tuple[float, float],
    with_turns: bool,
    with_success: bool = False,
    filtered: bool = False,
    max_staleness: int = 0,
):
    """The great-expectations suite for a trajectory summary frame; ``meta["check"]`` holds each check's name."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name="trajectories")
    items = _expectations(group_size, reward_bounds, max_staleness)
    items += _optional_expectations(with_turns, with_success, filtered)
    for name, expectation in items:
        expectation.meta = {"check": name}
        suite.add_expectation(expectation)
    return suite


def _orphan_turns(frame: pd.DataFrame, turns: pa.Table) -> list[dict]:
    keys = list(TRAJECTORY_KEY)
    turn_keys = turns.select(keys).to_pandas().drop_duplicates()
    merged = turn_keys.merge(frame[keys], on=keys, how="left", indicator=True)
    return merged.loc[merged["_merge"] == "left_only", keys].to_dict("records")


def check_semantics(
    trajectories: pa.Table,
    turns: pa.Table | None,
    group_size: int,
    reward_bounds: tuple[float, float],
    report: Any,
    success_rule: Callable[[float], bool | None] | None = None,
    filtered: bool = False,
    max_staleness: int = 0,
) -> None:
    """Layer 2: the great-expectations suite on the summary frame; failures are added to ``report``."""
    frame = trajectory_summary(trajectories, turns, success_rule)
    batch = _gx_batch_definition().get_batch(batch_parameters={"dataframe": frame})
    bounds = (float(reward_bounds[0]), float(reward_bounds[1]))
    suite = trajectory_suite(group_size, bounds, turns is not None, success_rule is not None, filtered, max_staleness)
    result = batch.validate(suite, result_format={"result_format": "COMPLETE"})
    keys = list(TRAJECTORY_KEY)
    for item in result.results:
        if item.success:
            continue
        kwargs = item.expectation_config.kwargs
        column = kwargs.get("column") or (
            f"{kwargs['column_A']},{kwargs['column_B']}" if "column_A" in kwargs else ",".join(kwargs["column_list"])
        )
        index = [i for i in item.result.get("unexpected_index_list") or [] if i in frame.index]
        rows = frame.loc[index, keys].to_dict("records")
        detail = str(item.exception_info.get("exception_message") or "") if item.exception_info else ""
        check = item.expectation_config.meta["check"]
        report.add("great_expectations", check, column, rows, detail or item.expectation_config.type)
    if turns is not None:
        orphans = _orphan_turns(frame, turns)
        if orphans:
            report.add("semantics", "turns_belong_to_trajectories", None, orphans, "turn rows without a trajectory")
