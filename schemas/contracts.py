"""Data contracts checked on every batch before it is used.

Layer 1 (pandera, on the Arrow table): structure, types, nullability, per-column ranges, unique keys.
Layer 2 (great-expectations, on a per-trajectory summary frame of lengths, sums and flags): semantics across
columns and rows. Both report the failing checks by name; the caller quarantines the batch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import TRAJECTORIES, TRAJECTORY_KEY, TURNS, TableSpec


@dataclass
class ContractReport:
    """Outcome of validating one batch: the failed checks, each with the offending rows (first 20)."""

    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def add(self, layer: str, check: str, column: str | None, rows: list[Any] | None = None, detail: str = "") -> None:
        self.failures.append(
            {"layer": layer, "check": check, "column": column, "rows": (rows or [])[:20], "detail": detail[:500]}
        )

    def failed_checks(self) -> list[str]:
        return sorted({f"{f['check']}" + (f"[{f['column']}]" if f["column"] else "") for f in self.failures})

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, "failures": self.failures}, indent=2, default=str)


def _pandera_schema(spec: TableSpec, checks: dict[str, list[Any]]):
    import pandera.pyarrow as pap

    columns = {
        c.name: pap.Column(c.type, nullable=c.nullable, checks=checks.get(c.name, []), description=c.description)
        for c in spec.columns
    }
    return pap.DataFrameSchema(columns, strict=True, unique=list(spec.key), name=spec.name)


@cache
def pandera_schema(table: str):
    """The pandera schema of ``table`` ('trajectories' or 'turns')."""
    import pandera.pyarrow as pap

    non_negative = [pap.Check.ge(0)]
    if table == "trajectories":
        checks = {
            "iteration": non_negative,
            "group_id": non_negative,
            "traj_index": non_negative,
            "env_seed": non_negative,
            "num_turns": [pap.Check.ge(1)],
            "num_actions": non_negative,
            "format_penalty": [pap.Check.le(0)],
            "response_length": [pap.Check.ge(1)],
            "group_reward_std": non_negative,
            "split": [pap.Check.isin(["train", "val"])],
            "behavior_source": [pap.Check.isin(["policy", "scripted"])],
            "temperature": [pap.Check.gt(0)],
        }
        return _pandera_schema(TRAJECTORIES, checks)
    if table == "turns":
        checks = {
            "turn_index": non_negative,
            "penalty": [pap.Check.le(0)],
            "split": [pap.Check.isin(["train", "val"])],
        }
        return _pandera_schema(TURNS, checks)
    raise ValueError(f"no pandera contract for table {table!r}")


def check_structure(table_name: str, table: pa.Table, report: ContractReport) -> None:
    """Layer 1: pandera on the Arrow table; failures are added to ``report``."""
    from pandera.errors import SchemaError, SchemaErrors

    try:
        pandera_schema(table_name).validate(table, lazy=True)
    except SchemaErrors as exc:
        for error in exc.schema_errors:
            _add_pandera_error(table_name, error, report)
    except SchemaError as exc:
        _add_pandera_error(table_name, exc, report)


def _add_pandera_error(table_name: str, error: Any, report: ContractReport) -> None:
    schema = getattr(error, "schema", None)
    column = getattr(error, "column_name", None) or (
        getattr(schema, "name", None) if schema is not None and not hasattr(schema, "columns") else None
    )
    check = str(getattr(error, "check", "") or getattr(error, "reason_code", "schema"))
    report.add("pandera", f"{table_name}:{check}", column, detail=str(error))


def trajectory_summary(trajectories: pa.Table, turns: pa.Table | None) -> pd.DataFrame:
    """Per-trajectory summary frame (lengths, sums, flags) for the semantic checks; no raw token lists."""

    def lengths(name: str) -> np.ndarray:
        return pc.list_value_length(trajectories[name]).to_numpy(zero_copy_only=False).astype("float64")

    frame = trajectories.select(
        [*TRAJECTORY_KEY, "env_seed", "num_turns", "total_reward", "env_reward", "format_penalty", "behavior_source"]
    ).to_pandas()
    frame["n_input_ids"] = lengths("input_ids")
    frame["n_loss_mask"] = lengths("loss_mask")
    frame["n_logprobs"] = lengths("behavior_logprobs")  # NaN where null (scripted)
    frame["n_trained"] = [int(np.sum(m)) for m in trajectories["loss_mask"].to_numpy(zero_copy_only=False)]
    logprobs = trajectories["behavior_logprobs"].to_pylist()
    frame["max_logprob"] = [max(lp) if lp else np.nan for lp in logprobs]
    frame["logprobs_finite"] = [all(math.isfinite(x) for x in lp) if lp is not None else None for lp in logprobs]
    frame["is_policy"] = frame["behavior_source"] == "policy"
    group_cols = ["run_id", "iteration", "split", "env", "group_id"]
    frame["group_members"] = frame.groupby(group_cols)["traj_index"].transform("size")
    frame["group_seeds"] = frame.groupby(group_cols)["env_seed"].transform("nunique")
    frame["reward_parts_sum"] = frame["env_reward"] + frame["format_penalty"]
    if turns is not None:
        counts = turns.select(list(TRAJECTORY_KEY)).to_pandas().value_counts().rename("turn_rows").reset_index()
        frame = frame.merge(counts, on=list(TRAJECTORY_KEY), how="left")
        frame["turn_rows"] = frame["turn_rows"].fillna(0)
    return frame


@lru_cache(maxsize=1)
def _gx_batch_definition():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("ragen").add_dataframe_asset(name="trajectory_summary")
    return asset.add_batch_definition_whole_dataframe("batch")


def trajectory_suite(group_size: int, reward_bounds: tuple[float, float], with_turns: bool):
    """The great-expectations suite for a trajectory summary frame."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    low, high = reward_bounds
    suite = gx.ExpectationSuite(name="trajectories")
    for expectation in (
        gxe.ExpectColumnPairValuesToBeEqual(column_A="n_input_ids", column_B="n_loss_mask"),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="n_input_ids", column_B="n_logprobs", ignore_row_if="either_value_is_missing"
        ),
        gxe.ExpectColumnValuesToBeBetween(column="n_trained", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="max_logprob", max_value=0.0),
        gxe.ExpectColumnValuesToBeInSet(column="logprobs_finite", value_set=[True]),
        gxe.ExpectColumnValuesToNotBeNull(
            column="n_logprobs", row_condition="is_policy==True", condition_parser="pandas"
        ),
        gxe.ExpectColumnValuesToBeBetween(column="total_reward", min_value=low - 1e-9, max_value=high + 1e-9),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="total_reward", column_B="reward_parts_sum"),
        gxe.ExpectColumnValuesToBeInSet(column="group_members", value_set=[group_size]),
        gxe.ExpectColumnValuesToBeInSet(column="group_seeds", value_set=[1]),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=list(TRAJECTORY_KEY)),
    ):
        suite.add_expectation(expectation)
    if with_turns:
        suite.add_expectation(gxe.ExpectColumnPairValuesToBeEqual(column_A="num_turns", column_B="turn_rows"))
    return suite


def check_semantics(
    trajectories: pa.Table,
    turns: pa.Table | None,
    group_size: int,
    reward_bounds: tuple[float, float],
    report: ContractReport,
) -> None:
    """Layer 2: the great-expectations suite on the summary frame; failures are added to ``report``."""
    frame = trajectory_summary(trajectories, turns)
    batch = _gx_batch_definition().get_batch(batch_parameters={"dataframe": frame})
    suite = trajectory_suite(group_size, reward_bounds, turns is not None)
    result = batch.validate(suite, result_format={"result_format": "COMPLETE"})
    for item in result.results:
        if item.success:
            continue
        kwargs = item.expectation_config.kwargs
        column = kwargs.get("column") or (
            f"{kwargs['column_A']},{kwargs['column_B']}"
            if "column_A" in kwargs
            else ",".join(kwargs.get("column_list", []))
        )
        rows = item.result.get("unexpected_index_list") or []
        keys = [frame.loc[i, list(TRAJECTORY_KEY)].tolist() for i in rows[:20] if i in frame.index]
        detail = str(item.exception_info.get("exception_message", "")) if item.exception_info else ""
        report.add("great_expectations", item.expectation_config.type, column, keys, detail)


def validate_trajectory_batch(
    trajectories: pa.Table, turns: pa.Table, group_size: int, reward_bounds: tuple[float, float]
) -> ContractReport:
    """Run both layers on one batch (trajectories and their turns)."""
    report = ContractReport()
    check_structure("trajectories", trajectories, report)
    check_structure("turns", turns, report)
    if report.ok:  # semantic checks assume the structure holds
        check_semantics(trajectories, turns, group_size, reward_bounds, report)
    return report
