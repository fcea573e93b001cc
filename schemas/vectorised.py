"""The data contracts computed directly on the Arrow batch, column at a time (pyarrow.compute + numpy).

Same checks, same stable names and the same offending rows as the library layers of :mod:`schemas.contracts`
(pandera on the Arrow table) and :mod:`schemas.suites` (great-expectations on a per-trajectory summary frame),
at a small fraction of their cost: a demo-sized batch (128 trajectories) takes milliseconds here against most of a
second there, nearly all of it the libraries' per-check bookkeeping. The library layers stay the reference: they
re-check every batch this module rejects (their findings join the report) and the tests run both on every kind of
bad batch and require the same verdict.

Conventions copied from the libraries so that both agree: a float NaN in a non-nullable column fails
``not_null`` (as in pandera); a rule never fails on a null value (pandera ignores nulls in rules; nullability is
its own check), but it does fail on a NaN; in the semantic checks a NaN counts as missing, as in pandas (the
rewards are non-nullable, so a NaN reward never gets that far; were it to, it would fail ``reward_in_bounds`` /
``reward_parts_sum`` here rather than be skipped).

Known differences, all on batches both reject: with a key column missing, pandera also tests the remaining key
columns for uniqueness and reports ``<table>:unique_key`` for rows that only share that partial key; after a
column's ``dtype`` failure pandera still checks its values (e.g. ``not_null`` on a column of Arrow type null), the
vectorised checks skip the column's other checks (and, for a key column, the key's uniqueness); some wrong types
(a struct key column) make the libraries raise. Under the default engine a rejected batch gets the libraries'
findings as well, or, if they raise, the error in ``reference_error``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import TOOL_ERRORS, TRAJECTORY_KEY, TableSpec

GROUP_COLUMNS = ("run_id", "iteration", "split", "env", "group_id")
REWARD_TOLERANCE = 1e-6
BOUND_SLACK = 1e-9

# Layer-1 rules by pandera factory name: a predicate (values -> passes) that Arrow computes.
_RULES: dict[str, Callable[..., Any]] = {
    "ge": lambda values, bound: pc.greater_equal(values, bound),
    "le": lambda values, bound: pc.less_equal(values, bound),
    "gt": lambda values, bound: pc.greater(values, bound),
    "in_range": lambda values, low, high: pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high)),
    "isin": lambda values, allowed: pc.is_in(values, value_set=pa.array(allowed, values.type)),
}


# -- shared helpers -------------------------------------------------------------------------------------------------
def _numpy(values: pa.Array | pa.ChunkedArray, fill: Any = None) -> np.ndarray:
    """A numpy copy of ``values``, nulls replaced by ``fill`` first when given."""
    if fill is not None:
        values = pc.fill_null(values, fill)
    return values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array) else values.to_numpy()


def _missing(values: pa.ChunkedArray) -> np.ndarray:
    """Null, or NaN for a float column: what pandas calls missing."""
    missing = pc.is_null(values, nan_is_null=pa.types.is_floating(values.type))
    return _numpy(missing)


def group_codes(table: pa.Table, columns: tuple[str, ...] | list[str]) -> np.ndarray:
    """One integer per row, equal for rows with equal values in ``columns`` (null and NaN are values: missing)."""
    codes = np.zeros(table.num_rows, dtype=np.int64)
    for name in columns:
        values = table[name].combine_chunks()
        if pa.types.is_floating(values.type):  # NaN and null are the same missing value (pandas semantics)
            values = pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
        encoded = pc.dictionary_encode(values, null_encoding="encode")
        indices = _numpy(encoded.indices).astype(np.int64)
        # renumber after each column, so the combined code stays below the number of rows
        codes = np.unique(codes * len(encoded.dictionary) + indices, return_inverse=True)[1].reshape(-1)
    return codes


def key_records(table: pa.Table, keys: tuple[str, ...] | list[str], bad: np.ndarray) -> list[dict]:
    """The ``keys`` columns (those present) of the rows where ``bad`` holds, as dicts in row order."""
    present = [k for k in keys if k in table.column_names]
    return table.select(present).filter(pa.array(bad, pa.bool_())).to_pylist()


# -- layer 1: structure ---------------------------------------------------------------------------------------------
def _normal_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with the distinctions pandera (through narwhals) does not make: large/small strings and lists."""
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(_normal_type(kind.value_type))
    return kind


def _structure_columns(spec: TableSpec, table: pa.Table, report: Any, rules: dict[str, tuple]) -> set[str]:
    """Types, nullability and ``rules`` of the columns present; returns the columns of the wrong type."""
    present, mistyped = set(table.column_names), set()
    for column in spec.columns:
        if column.name not in present:
            continue
        values = table[column.name]
        if _normal_type(values.type) != _normal_type(column.type):
            detail = f"column {column.name!r} has type {values.type}, the contract says {column.type}"
            report.add("structure", f"{spec.name}.{column.name}:dtype", column.name, [], detail, row_count=0)
            mistyped.add(column.name)
            continue  # value rules assume the type
        bad = _missing(values) if not column.nullable else None  # pandera counts a float NaN as null here
        if bad is not None and bad.any():
            detail = f"{int(bad.sum())} null value(s) in non-nullable column {column.name!r}"
            report.add(
                "structure",
                f"{spec.name}.{column.name}:not_null",
                column.name,
                key_records(table, spec.key, bad),
                detail,
                row_count=int(bad.sum()),
            )
        for name, factory, args in rules.get(column.name, ()):
            bad = _numpy(pc.invert(_RULES[factory](values, *args)), fill=False)  # null: not failing
            if bad.any():
                detail = f"{int(bad.sum())} value(s) of {column.name!r} break {factory}{tuple(args)}"
                report.add(
                    "structure",
                    f"{spec.name}.{column.name}:{name}",
                    column.name,
                    key_records(table, spec.key, bad),
                    detail,
                    row_count=int(bad.sum()),
                )
    return mistyped


def check_structure(spec: TableSpec, table: pa.Table, report: Any, rules: dict[str, tuple]) -> None:
    """Layer 1 on the Arrow table: columns present and no others, types, nullability, ``rules``, unique key."""
    names = set(table.column_names)
    for column in spec.columns:
        if column.name not in names:
            report.add(
                "structure",
                f"{spec.name}:missing_column",
                column.name,
                [],
                f"column {column.name!r} is missing",
                row_count=0,
            )
    expected = set(spec.column_names)
    for name in table.column_names:
        if name not in expected:
            report.add(
                "structure",
                f"{spec.name}:unexpected_column",
                name,
                [],
                f"column {name!r} is not in the contract of {spec.name}",
                row_count=0,
            )
    mistyped = _structure_columns(spec, table, report, rules)
    if spec.key and names.issuperset(spec.key) and not mistyped.intersection(spec.key) and table.num_rows:
        codes = group_codes(table, spec.key)
        bad = np.bincount(codes)[codes] > 1
        if bad.any():
            detail = f"{int(bad.sum())} rows share a key ({', '.join(spec.key)}) with another row"
            report.add(
                "structure",
                f"{spec.name}:unique_key",
                None,
                key_records(table, spec.key, bad),
                detail,
                row_count=int(bad.sum()),
            )


# -- layer 2: semantics ---------------------------------------------------------------------------------------------
def list_stats(values: pa.ChunkedArray) -> dict[str, np.ndarray]:
    """Per row of a list column: ``present`` (not a null list), ``length`` (NaN for a null list), ``nulls`` (null
    elements), ``min``/``max``/``sum`` over the finite elements (NaN / NaN / 0 without any) and ``finite`` (every
    element finite and not null)."""
    array = values.combine_chunks()
    present = _numpy(pc.is_valid(array))
    counts = _numpy(pc.list_value_length(array), fill=0).astype(np.int64)
    flat = pc.list_flatten(array)  # the elements of the non-null lists, row after row
    element_null = _numpy(pc.is_null(flat))
    numbers = _numpy(flat.cast(pa.float64()), fill=0.0)
    finite = np.isfinite(numbers) & ~element_null
    # one reduceat segment per row; a sentinel element keeps the start of trailing empty rows in range
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else counts

    def per_row(ufunc: np.ufunc, elements: np.ndarray, empty: float) -> np.ndarray:
        reduced = ufunc.reduceat(np.append(elements, empty), starts) if len(counts) else elements[:0]
        return np.where(counts > 0, reduced, empty)

    finite_count = per_row(np.add, finite.astype(np.int64), 0)
    low = per_row(np.minimum, np.where(finite, numbers, np.inf), np.inf)
    high = per_row(np.maximum, np.where(finite, numbers, -np.inf), -np.inf)
    return {
        "present": present,
        "length": np.where(present, counts, np.nan),
        "nulls": per_row(np.add, element_null.astype(np.int64), 0),
        "min": np.where(finite_count > 0, low, np.nan),
        "max": np.where(finite_count > 0, high, np.nan),
        "sum": per_row(np.add, np.where(finite, numbers, 0.0), 0.0),
        "finite": finite_count == counts,
    }


def _differ(a: np.ndarray, b: np.ndarray, ignore: np.ndarray) -> np.ndarray:
    """Rows where ``a != b`` (NaN differs from everything), outside ``ignore``."""
    with np.errstate(invalid="ignore"):
        return ~ignore & ~(a == b)


def _distinct_per_group(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row: how many distinct ``values`` (codes; missing is one value) its group holds."""
    pairs = np.unique(groups * (int(values.max()) + 1) + values)  # one per distinct (group, value)
    return np.bincount(pairs // (int(values.max()) + 1), minlength=int(groups.max()) + 1)[groups]


def _token_checks(table: pa.Table) -> list[tuple[str, str, np.ndarray]]:
    """Checks on the token lists: (check name, column label, failing rows)."""
    ids, mask, logprobs = (list_stats(table[c]) for c in ("input_ids", "loss_mask", "behavior_logprobs"))
    response_length = _numpy(table["response_length"]).astype(np.float64)
    policy = _numpy(pc.equal(table["behavior_source"], "policy"), fill=False)
    with np.errstate(invalid="ignore"):
        return [
            (
                "loss_mask_length_matches_input_ids",
                "n_input_ids,n_loss_mask",
                _differ(ids["length"], mask["length"], ~ids["present"] & ~mask["present"]),
            ),
            (
                "logprobs_length_matches_input_ids",
                "n_input_ids,n_logprobs",
                _differ(ids["length"], logprobs["length"], ~ids["present"] | ~logprobs["present"]),
            ),
            (
                "token_lists_have_no_null_elements",
                "n_null_tokens",
                (ids["nulls"] + mask["nulls"] + logprobs["nulls"]) != 0,
            ),
            ("loss_mask_is_binary", "mask_binary", (mask["min"] < 0) | (mask["max"] > 1)),
            ("input_ids_non_negative", "min_input_id", ids["min"] < 0),
            ("has_trained_token", "n_trained", mask["sum"] < 1),
            (
                "response_length_matches_mask",
                "response_length,n_trained",
                _differ(response_length, mask["sum"], np.zeros(len(response_length), bool)),
            ),
            ("logprobs_finite", "logprobs_finite", logprobs["present"] & ~logprobs["finite"]),
            ("logprobs_non_positive", "max_logprob", logprobs["max"] > 0),
            ("policy_rows_have_logprobs", "n_logprobs", policy & ~logprobs["present"]),
        ]


def _reward_checks(
    table: pa.Table, bounds: tuple[float, float], success_rule: Callable[[float], bool | None] | None
) -> list[tuple[str, str, np.ndarray]]:
    """Score bounds, the reward parts' sum and, given a rule, success as the env reward implies it."""
    total = _numpy(table["total_reward"], fill=np.nan).astype(np.float64)
    env = _numpy(table["env_reward"], fill=np.nan).astype(np.float64)
    penalty = _numpy(table["format_penalty"], fill=np.nan).astype(np.float64)
    low, high = bounds
    with np.errstate(invalid="ignore"):
        checks = [
            ("reward_in_bounds", "total_reward", ~((total >= low - BOUND_SLACK) & (total <= high + BOUND_SLACK))),
            ("reward_parts_sum", "reward_parts_gap", ~(np.abs(total - (env + penalty)) <= REWARD_TOLERANCE)),
        ]
    if success_rule is not None:
        implied: dict[float, bool | None] = {}  # the rule runs once per distinct reward (NaN: every time)
        bad = []
        for reward, success in zip(env.tolist(), table["success"].to_pylist(), strict=True):
            if reward not in implied:
                implied[reward] = success_rule(reward)
            expected = implied[reward]
            bad.append(expected is not None and success is not None and bool(success) != bool(expected))
        checks.append(("success_matches_reward", "success,success_expected", np.array(bad, dtype=bool)))
    return checks


def _staleness_check(table: pa.Table, max_staleness: int) -> tuple[str, str, np.ndarray]:
    """Each row's policy is at most ``max_staleness`` updates older than its iteration, and never newer."""
    iteration = _numpy(table["iteration"].cast(pa.int64()), fill=-1)
    version = _numpy(table["policy_version"].cast(pa.int64()), fill=np.iinfo(np.int64).max)  # null: never within
    staleness = iteration - version
    return "policy_version_within_staleness", "staleness", (staleness < 0) | (staleness > max_staleness)


def _group_checks(table: pa.Table, group_size: int, filtered: bool) -> list[tuple[str, str, np.ndarray]]:
    """Group sizes, shared seeds, unique keys and the filter's decision columns by split."""
    groups = group_codes(table, GROUP_COLUMNS)
    split = _numpy(table["split"].cast(pa.string()), fill="")
    train, val = split == "train", split == "val"
    no_kept, no_std = _missing(table["kept"]), _missing(table["group_reward_std"])
    keys = group_codes(table, TRAJECTORY_KEY)
    checks = [
        ("group_size", "group_members", np.bincount(groups)[groups] != group_size),
        ("group_seed_shared", "group_seeds", _distinct_per_group(groups, group_codes(table, ["env_seed"])) != 1),
        ("unique_trajectory_key", ",".join(TRAJECTORY_KEY), np.bincount(keys)[keys] > 1),
        ("val_rows_have_no_filter_decision", "kept", val & ~no_kept),
        ("val_rows_have_no_filter_decision", "group_reward_std", val & ~no_std),
    ]
    if filtered:
        kept_values = _distinct_per_group(groups, group_codes(table, ["kept"]))
        std_values = _distinct_per_group(groups, group_codes(table, ["group_reward_std"]))
        checks += [
            ("train_rows_have_filter_decision", "kept", train & no_kept),
            ("train_rows_have_filter_decision", "group_reward_std", train & no_std),
            ("filter_decision_constant_in_group", "group_kept_values", train & (kept_values != 1)),
            ("filter_decision_constant_in_group", "group_std_values", train & (std_values != 1)),
        ]
    else:
        checks += [
            ("train_rows_unfiltered", "kept", train & ~no_kept),
            ("train_rows_unfiltered", "group_reward_std", train & ~no_std),
        ]
    return checks


def _turn_codes(trajectories: pa.Table, turns: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Trajectory-key codes of the trajectories and of the turns, in one code space."""
    keys = list(TRAJECTORY_KEY)
    both = pa.concat_tables([trajectories.select(keys), turns.select(keys).cast(trajectories.select(keys).schema)])
    codes = group_codes(both, keys)
    return codes[: trajectories.num_rows], codes[trajectories.num_rows :]


def _turn_checks(trajectories: pa.Table, turns: pa.Table) -> tuple[list[tuple[str, str, np.ndarray]], list[dict]]:
    """``turn_count_matches`` as a row check, and the rows of ``turns_belong_to_trajectories``: the distinct keys of
    turn rows without a trajectory, in order of first appearance."""
    trajectory_codes, turn_codes = _turn_codes(trajectories, turns)
    size = int(max(trajectory_codes.max(initial=-1), turn_codes.max(initial=-1))) + 1
    turn_rows = np.bincount(turn_codes, minlength=size)[trajectory_codes]
    num_turns = _numpy(trajectories["num_turns"]).astype(np.int64)
    orphan = ~np.isin(turn_codes, trajectory_codes)
    first = np.zeros(len(turn_codes), dtype=bool)
    first[np.unique(turn_codes, return_index=True)[1]] = True  # one row per distinct key, at its first appearance
    orphans = key_records(turns, TRAJECTORY_KEY, orphan & first) if orphan.any() else []
    checks = [("turn_count_matches", "num_turns,turn_rows", num_turns != turn_rows)]
    if "tool_calls" in turns.column_names:
        bad_turns = np.bincount(turn_codes, weights=_bad_tool_turns(turns), minlength=size)[trajectory_codes]
        checks.append(("tool_calls_consistent", "bad_tool_turns", bad_turns > 0))  # as the summary names it
    return checks, orphans


def _bad_tool_turns(turns: pa.Table) -> np.ndarray:
    """Per turn row, 1.0 when its ``tool_calls`` break the column's rules (those of
    :func:`schemas.suites.tool_calls_problem`, computed on the flattened structs), else 0.0."""
    calls = turns["tool_calls"].combine_chunks()
    items = pc.list_flatten(calls)
    parents = _numpy(pc.list_parent_indices(calls)).astype(np.int64)
    error = items.field("error")
    seconds = _numpy(items.field("duration_s").cast(pa.float64()), fill=np.nan).astype(np.float64)
    ran = _numpy(pc.or_kleene(pc.is_null(error), pc.is_in(error, value_set=pa.array(["raised", "timeout"]))), False)
    known = _numpy(pc.or_kleene(pc.is_null(error), pc.is_in(error, value_set=pa.array(list(TOOL_ERRORS)))), False)
    unnamed = _numpy(
        pc.and_(pc.is_null(items.field("name")), pc.invert(pc.fill_null(pc.equal(error, "bad_json"), False))), False
    )
    missing = _numpy(pc.or_(pc.is_null(items.field("result")), pc.is_null(items.field("arguments"))), False)
    with np.errstate(invalid="ignore"):
        bad_seconds = ~np.isfinite(seconds) | (seconds < 0) | (~ran & (seconds != 0))
    bad_item = ~known | unnamed | missing | bad_seconds
    rows = turns.num_rows
    bad = np.bincount(parents, weights=bad_item.astype(np.float64), minlength=rows) > 0
    ran_count = np.bincount(parents, weights=ran.astype(np.float64), minlength=rows)
    actions = _numpy(pc.list_value_length(turns["actions"]), fill=0).astype(np.float64)
    listed = _numpy(pc.is_valid(calls), False)
    return (listed & (bad | (ran_count != actions))).astype(np.float64)


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
    """Layer 2 on the Arrow tables: every check of :data:`schemas.suites.SEMANTIC_CHECKS`; failures (with the
    trajectory keys of the offending rows) are added to ``report``. Assumes layer 1 passed."""
    checks: list[tuple[str, str, np.ndarray]] = []
    if trajectories.num_rows:
        checks += _token_checks(trajectories) + _reward_checks(trajectories, reward_bounds, success_rule)
        checks += _group_checks(trajectories, group_size, filtered)
        checks.append(_staleness_check(trajectories, max_staleness))
    orphans: list[dict] = []
    if turns is not None:
        turn_checks, orphans = _turn_checks(trajectories, turns)
        checks += turn_checks
    for name, column, bad in checks:
        if bad.any():
            rows = key_records(trajectories, TRAJECTORY_KEY, bad)
            report.add("semantics", name, column, rows, f"{int(bad.sum())} of {len(bad)} trajectories fail {name}")
    if orphans:
        report.add("semantics", "turns_belong_to_trajectories", None, orphans, "turn rows without a trajectory")
