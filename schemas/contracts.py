"""Data contracts checked on every batch before it is used.

Layer 1 (structure, on the Arrow table): types, nullability, per-column ranges, unique keys; every table.
Layer 2 (semantics, trajectory batches): lengths, sums and flags across the columns and rows of a batch.

Each layer has two implementations that must agree (the tests run both on every kind of bad batch):

- the library reference: pandera on the Arrow table (layer 1) and a great-expectations suite on a per-trajectory
  summary frame (layer 2, :mod:`schemas.suites`);
- :mod:`schemas.vectorised`: the same checks computed column at a time with pyarrow.compute and numpy, at a small
  fraction of the cost (the libraries spend most of a second per demo-sized batch on per-check bookkeeping).

``engine`` picks what runs: ``"auto"`` (the default) runs the vectorised checks on every batch and, when they
reject it, the library reference as well, whose findings join the report (a second opinion on every rejected
batch; a check only the libraries fail still rejects it); ``"vectorised"`` and ``"libraries"`` run one
implementation alone; ``"both"`` runs both on every batch. The report's ``engines`` field says which ran (and
``reference_error`` what the libraries raised, if they raised while re-checking a rejected batch).

Each failure names a stable check (reports and tests rely on these strings):

- structure: ``<table>.<column>:dtype``, ``<table>.<column>:not_null``, ``<table>.<column>:<rule>`` (rules such
  as ``ge_0``, ``le_0``, ``gt_0``, ``between_0_1``, ``isin``), ``<table>:unique_key``, ``<table>:missing_column``,
  ``<table>:unexpected_column``;
- semantics: the names in :data:`schemas.suites.SEMANTIC_CHECKS`;
- raised by the storage layer around these: ``staged_batch_readable`` (a staged batch cannot be read) and
  ``<table>:partition`` (rows written to another run/iteration's partition).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import TABLES, TableSpec

MAX_REPORTED_ROWS = 20
ENGINES = ("auto", "vectorised", "libraries", "both")

# Per-column rules of layer 1: column -> ((rule name, pandera check factory name, args), ...).
_NON_NEGATIVE = (("ge_0", "ge", (0,)),)
_SPLIT = (("isin", "isin", (["train", "val"],)),)
_SHARE = (("between_0_1", "in_range", (0, 1)),)
COLUMN_RULES: dict[str, dict[str, tuple[tuple[str, str, tuple[Any, ...]], ...]]] = {
    "trajectories": {
        "iteration": _NON_NEGATIVE,
        "split": _SPLIT,
        "group_id": _NON_NEGATIVE,
        "traj_index": _NON_NEGATIVE,
        "env_seed": _NON_NEGATIVE,
        "num_turns": (("ge_1", "ge", (1,)),),
        "num_actions": _NON_NEGATIVE,
        "format_penalty": (("le_0", "le", (0,)),),
        "response_length": (("ge_1", "ge", (1,)),),
        "group_reward_std": _NON_NEGATIVE,
        "policy_version": _NON_NEGATIVE,
        "behavior_source": (("isin", "isin", (["policy", "scripted"],)),),
        "temperature": (("gt_0", "gt", (0,)),),
    },
    "turns": {
        "iteration": _NON_NEGATIVE,
        "split": _SPLIT,
        "turn_index": _NON_NEGATIVE,
        "penalty": (("le_0", "le", (0,)),),
        "response_tokens": _NON_NEGATIVE,
    },
    "metrics": {"iteration": _NON_NEGATIVE},
    "evaluations": {
        "iteration": _NON_NEGATIVE,
        "instances": (("ge_1", "ge", (1,)),),
        "k": (("ge_1", "ge", (1,)),),
        "temperature": (("gt_0", "gt", (0,)),),
        "success_rate": _SHARE,
        "pass_at_k": _SHARE,
        "response_length_mean": _NON_NEGATIVE,
    },
    "checkpoints": {"iteration": _NON_NEGATIVE, "format": (("isin", "isin", (["deepspeed", "hf", "lora"],)),)},
    "events": {"iteration": _NON_NEGATIVE},
    "runs": {
        "status": (("isin", "isin", (["running", "completed", "failed", "interrupted", "deleting"],)),),
        "iterations_done": _NON_NEGATIVE,
    },
}


@dataclass
class ContractReport:
    """Outcome of validating one batch: the failed checks, each with the offending rows (their keys, first 20)."""

    failures: list[dict[str, Any]] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    reference_error: str | None = None  # the library reference raised while re-checking a rejected batch

    @property
    def ok(self) -> bool:
        return not self.failures

    def add(
        self,
        layer: str,
        check: str,
        column: str | None = None,
        rows: list[Any] | None = None,
        detail: str = "",
        row_count: int | None = None,
    ) -> None:
        rows = rows or []
        self.failures.append(
            {
                "layer": layer,
                "check": check,
                "column": column,
                "row_count": len(rows) if row_count is None else row_count,
                "rows": rows[:MAX_REPORTED_ROWS],
                "detail": detail[:500],
            }
        )

    def merge(self, other: ContractReport) -> None:
        """Add ``other``'s engines and its failures of checks this report does not name yet."""
        known = set(self.failed_checks())
        self.failures += [f for f in other.failures if f["check"] not in known]
        self.engines += [e for e in other.engines if e not in self.engines]

    def failed_checks(self) -> list[str]:
        """The stable names of the failed checks, sorted."""
        return sorted({f["check"] for f in self.failures})

    def to_dict(self, **context: Any) -> dict[str, Any]:
        return {
            **context,
            "ok": self.ok,
            "failed_checks": self.failed_checks(),
            "failures": self.failures,
            "engines": self.engines,
            **({"reference_error": self.reference_error} if self.reference_error else {}),
        }

    def to_json(self, **context: Any) -> str:
        """Machine-readable report; ``context`` (run, iteration, stage...) is added at the top level."""
        return json.dumps(self.to_dict(**context), indent=2, default=str)


def table_spec(table: str | TableSpec) -> TableSpec:
    """``table`` itself, or the project's spec of that name."""
    if isinstance(table, TableSpec):
        return table
    if table not in TABLES:
        raise ValueError(f"no contract for table {table!r}; tables: {', '.join(TABLES)}")
    return TABLES[table]


def pandera_schema(table: str | TableSpec):
    """The pandera schema of ``table``: the Arrow types, nullability, unique key and :data:`COLUMN_RULES`."""
    spec = table_spec(table)
    try:
        hash(spec)
    except TypeError:  # a column default that is a list: build it uncached
        return _pandera_schema.__wrapped__(spec)
    return _pandera_schema(spec)


@cache
def _pandera_schema(spec: TableSpec):
    import pandera.pyarrow as pap

    rules = COLUMN_RULES.get(spec.name, {})
    columns = {
        c.name: pap.Column(
            c.type,
            nullable=c.nullable,
            checks=[getattr(pap.Check, factory)(*args, name=name) for name, factory, args in rules.get(c.name, ())],
            description=c.description,
        )
        for c in spec.columns
    }
    return pap.DataFrameSchema(columns, strict=True, unique=list(spec.key), name=spec.name)


def key_rows(table: pa.Table, spec: TableSpec, mask: pa.Array | pa.ChunkedArray | None = None) -> list[dict]:
    """The key columns (those present) of the rows where ``mask`` holds, as dicts."""
    keys = [k for k in spec.key if k in table.column_names]
    selected = table.select(keys)
    if mask is not None:
        selected = selected.filter(pc.fill_null(mask, False))
    return selected.to_pylist()


def _failing_rows(table: pa.Table, spec: TableSpec, reason: str, column: str | None, cases: Any) -> list[dict]:
    if reason == "DUPLICATES":
        keys = [k for k in spec.key if k in table.column_names]
        frame = table.select(keys).to_pandas()
        return frame[frame.duplicated(keep=False)].to_dict("records")
    if column is None or column not in table.column_names:
        return []
    values = table[column]
    if reason == "SERIES_CONTAINS_NULLS":  # pandera counts a float NaN as null
        return key_rows(table, spec, pc.is_null(values, nan_is_null=pa.types.is_floating(values.type)))
    if reason == "DATAFRAME_CHECK" and isinstance(cases, pa.Table) and column in cases.column_names:
        bad = cases[column].combine_chunks()
        return key_rows(table, spec, pc.is_in(values, value_set=bad.drop_null()))
    return []


def _check_name(table_name: str, reason: str, column: str | None, error: Any) -> str:
    if reason == "DUPLICATES":
        return f"{table_name}:unique_key"
    if reason == "COLUMN_NOT_IN_DATAFRAME":
        return f"{table_name}:missing_column"
    if reason == "COLUMN_NOT_IN_SCHEMA":
        return f"{table_name}:unexpected_column"
    if reason == "WRONG_DATATYPE":
        return f"{table_name}.{column}:dtype"
    if reason == "SERIES_CONTAINS_NULLS":
        return f"{table_name}.{column}:not_null"
    check = getattr(error, "check", None)
    rule = getattr(check, "name", None) or str(check or reason.lower())
    return f"{table_name}.{column}:{rule}" if column else f"{table_name}:{rule}"


def _add_pandera_error(spec: TableSpec, table: pa.Table, error: Any, report: ContractReport) -> None:
    reason = error.reason_code.name if error.reason_code is not None else "SCHEMA"
    schema = getattr(error, "schema", None)
    column = getattr(schema, "name", None) if schema is not None and not hasattr(schema, "columns") else None
    cases = error.failure_cases
    if reason in ("COLUMN_NOT_IN_DATAFRAME", "COLUMN_NOT_IN_SCHEMA") and isinstance(cases, str):
        column = cases
    rows = _failing_rows(table, spec, reason, column, cases)
    report.add("pandera", _check_name(spec.name, reason, column, error), column, rows, str(error))


def check_structure(table_name: str | TableSpec, table: pa.Table, report: ContractReport) -> None:
    """Layer 1, library reference: pandera on the Arrow table; failures are added to ``report``."""
    from pandera.errors import SchemaError, SchemaErrors

    spec = table_spec(table_name)
    try:
        pandera_schema(spec).validate(table, lazy=True)
    except SchemaErrors as exc:
        for error in exc.schema_errors:
            _add_pandera_error(spec, table, error, report)
    except SchemaError as exc:
        _add_pandera_error(spec, table, exc, report)


Checker = Callable[[ContractReport], None]


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"unknown contract engine {engine!r}; engines: {', '.join(ENGINES)}")


def _run_engines(engine: str, vectorised: Checker, libraries: Checker) -> ContractReport:
    """Run the implementations ``engine`` asks for (see the module docstring) and merge their reports."""
    _check_engine(engine)
    report = ContractReport()
    if engine != "libraries":
        vectorised(report)
        report.engines.append("vectorised")
    if engine in ("libraries", "both"):
        reference = ContractReport(engines=["pandera+great_expectations"])
        libraries(reference)
        report.merge(reference)
    elif engine == "auto" and not report.ok:  # a second opinion: the batch is rejected whatever the libraries do
        reference = ContractReport(engines=["pandera+great_expectations"])
        try:
            libraries(reference)
        except Exception as exc:  # noqa: BLE001 - a library failing on a malformed batch must not stop its quarantine
            report.reference_error = f"{type(exc).__name__}: {exc}"[:500]
        else:
            report.merge(reference)
    return report


def validate_rows(table_name: str | TableSpec, table: pa.Table, *, engine: str = "auto") -> ContractReport:
    """Layer 1 alone, for tables without a semantic suite (metrics, evaluations, checkpoints, events)."""
    from schemas import vectorised as vec

    spec = table_spec(table_name)
    return _run_engines(
        engine,
        lambda report: vec.check_structure(spec, table, report, COLUMN_RULES.get(spec.name, {})),
        lambda report: check_structure(spec, table, report),
    )


def validate_trajectory_batch(
    trajectories: pa.Table,
    turns: pa.Table,
    group_size: int,
    reward_bounds: tuple[float, float],
    *,
    success_rule: Callable[[float], bool | None] | None = None,
    filtered: bool = False,
    engine: str = "auto",
    max_staleness: int = 0,
) -> ContractReport:
    """Run both layers on one batch (trajectories and their turns).

    ``success_rule`` maps a trajectory's ``env_reward`` to the ``success`` it implies (None: not implied); without
    it success is not checked against the reward. ``filtered`` says whether the variance filter has run: before it,
    no row may carry a filter decision; after it, every train row must, the same for all members of a group.
    Validation rows never carry one. ``max_staleness``: every row's ``iteration - policy_version`` lies in ``[0,
    max_staleness]`` (the run's ``trainer.max_staleness``; 0: the batch's own policy sampled it). ``engine``: which
    implementation runs (module docstring); the default checks
    every batch with the vectorised one and lets the libraries re-check a rejected batch.
    """
    from schemas import vectorised as vec

    trajectory_spec, turn_spec = TABLES["trajectories"], TABLES["turns"]

    def vectorised(report: ContractReport) -> None:
        vec.check_structure(trajectory_spec, trajectories, report, COLUMN_RULES["trajectories"])
        vec.check_structure(turn_spec, turns, report, COLUMN_RULES["turns"])
        if report.ok:  # semantic checks assume the structure holds
            vec.check_semantics(
                trajectories, turns, group_size, reward_bounds, report, success_rule, filtered, max_staleness
            )

    def libraries(report: ContractReport) -> None:
        from schemas.suites import check_semantics

        check_structure(trajectory_spec, trajectories, report)
        check_structure(turn_spec, turns, report)
        if report.ok:
            check_semantics(
                trajectories, turns, group_size, reward_bounds, report, success_rule, filtered, max_staleness
            )

    return _run_engines(engine, vectorised, libraries)
