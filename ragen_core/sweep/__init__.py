"""Hyper-parameter sweeps: a base config, a grid and/or random search over ``key=value`` overrides, and seeds.

A sweep expands into points; each point is an ordinary run whose manifest records the sweep id, the point's index
and its overrides (so the ``runs`` table, and through it every other table, can be grouped by sweep). The sweep id
and the run ids derive from the sweep's spec, so running the same sweep again resumes it: completed points are
skipped and failed ones resume from their last committed iteration (or resume one alone with ``ragen resume``).

Search syntax (CLI ``--grid`` / ``--random``, deployment parameters ``grid`` / ``random``):

- grid: ``algorithm.filter_ratio=[0.25,0.5,1.0]`` (a YAML list; a scalar is a one-value list);
- random: ``actor.lr=loguniform(1e-4,1e-2)``, ``algorithm.clip_high=uniform(0.2,0.3)``,
  ``rollout.group_size=randint(4,8)`` (both ends included) or ``algorithm.estimator=choice([grpo,gae])``;
  ``samples`` draws per grid combination, from a generator seeded by the sweep's ``search_seed``.

The package: :mod:`~ragen_core.sweep.plan` (the search syntax and the plan), :mod:`~ragen_core.sweep.store` (the
plan stored under the data root, the points' comparison) and here the sweep's request and its course.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_core.config import RunConfig
from ragen_core.run.entry import run_lake
from ragen_core.run.requests import ConfigInput, resolve_config
from ragen_core.storage import DataLake
from ragen_core.storage.names import validate_run_id
from ragen_core.storage.storecopy import refresh, root_address
from ragen_core.sweep.plan import (
    DEFAULT_MAX_POINTS,
    DISTRIBUTIONS,
    SWEEP_ID_MAX_LENGTH,
    RandomSpec,
    SweepError,
    SweepPlan,
    SweepPoint,
    check_size,
    parse_grid,
    parse_random,
    parse_seeds,
    plan_sweep,
    with_sweep_id,
)
from ragen_core.sweep.store import (
    COMPARISON_SCHEMA,
    COMPARISON_SQL,
    COMPARISON_TABLES,
    compare_sweep,
    read_sweep,
    record_sweep,
    sweep_file,
)


@dataclass(frozen=True)
class SweepRequest:
    """A sweep (``ragen sweep``, the ``sweep`` flow, ``ragen reproduce``): its base config, its plan (every point's
    config validated once), the point indices to run (None: all), the deployment each point runs as (None: in this
    process) and how often to look at the submitted points. The search's parameters are the plan's spec."""

    base: RunConfig
    lake: DataLake
    plan: SweepPlan
    points: tuple[int, ...] | None = None
    deployment: str | None = None
    poll_seconds: float = 2.0
    search: dict[str, Any] = field(default_factory=dict)

    @property
    def sweep_id(self) -> str:
        """The sweep's id (its points' run ids are ``<sweep id>-p<NNN>``)."""
        return self.plan.sweep_id

    @property
    def address(self) -> str:
        """How the points' processes name the data root: the folder's absolute path, or the bucket's URL when the
        lake is the local copy of one (each worker opens its own copy)."""
        return root_address(self.lake.root)

    def chosen(self) -> list[SweepPoint]:
        """The points this request runs, in the plan's order."""
        return [p for p in self.plan.points if self.points is None or p.index in set(self.points)]

    def parameters(self) -> dict[str, Any]:
        """The request as the ``sweep`` flow's plain parameters."""
        return {
            "config": self.base.to_dict(),
            "data_root": self.address,
            "sweep_id": self.sweep_id,
            **self.search,
            "deployment": self.deployment,
            "poll_seconds": self.poll_seconds,
            "points": None if self.points is None else list(self.points),
        }


def sweep_request(
    config: ConfigInput = None,
    data_root: str | Path | DataLake = "data",
    grid: list[str] | None = None,
    random: list[str] | None = None,
    samples: int = 0,
    seeds: int | str | list[int] | None = None,
    sweep_id: str | None = None,
    overrides: list[str] | None = None,
    deployment: str | None = None,
    points: list[int] | None = None,
    search_seed: int = 0,
    poll_seconds: float = 2.0,
    max_points: int = DEFAULT_MAX_POINTS,
    plan: SweepPlan | None = None,
) -> SweepRequest:
    """The request of a sweep, its plan made here (every point's config validated; nothing written): a grid
    (``key=[v1,v2]``) x random draws (``key=dist(args)``, ``samples`` per combination, ``search_seed``) x ``seeds``
    over the base ``config`` plus ``overrides``. ``plan``: a plan the caller made of the same base (``ragen
    reproduce``), used as it is. Raises :class:`~ragen_core.sweep.SweepError`,
    :class:`~ragen_core.config.ConfigError`."""
    if sweep_id is not None:
        validate_run_id(sweep_id, "sweep id")  # it prefixes the points' run ids: a name, never a pattern or a path
    base = resolve_config(config, overrides)
    if plan is None:
        plan = plan_sweep(
            base, list(grid or []), list(random or []), samples, seeds, sweep_id, search_seed, max_points
        )
    search = {
        "grid": list(grid or []),
        "random": list(random or []),
        "samples": samples,
        "seeds": seeds,
        "search_seed": search_seed,
        "max_points": max_points,
    }
    chosen = None if points is None else tuple(points)
    return SweepRequest(base, run_lake(data_root), plan, chosen, deployment, poll_seconds, search)


REMOVED = "removed"  # a point's status when it ran in this sweep but its run is gone from the data root


def _comparison_rows(lake: DataLake, plan: SweepPlan) -> list[dict[str, Any]]:
    return compare_sweep(lake, plan).to_pylist()


def run_sweep(
    request: SweepRequest,
    run_points: Callable[[list[SweepPoint]], dict[str, str]],
    record: Callable[[DataLake, SweepPlan], Any] = record_sweep,
    compare: Callable[[DataLake, SweepPlan], list[dict[str, Any]]] = _comparison_rows,
) -> dict[str, Any]:
    """record the plan -> run the chosen points (``run_points``: each point's run id -> its outcome, COMPLETED or
    else; each point is an ordinary run) -> the comparison, a row per point with its outcome ("not run": a point
    the request did not choose). ``record``/``compare``: :func:`record_sweep` and :func:`compare_sweep`'s rows, or
    the flows' Prefect tasks of them."""
    lake, plan = request.lake, request.plan
    record(lake, plan)
    outcomes = run_points(request.chosen())
    refresh(lake.root)  # a data root in a bucket: what the points' workers committed, from other hosts too
    rows = compare(lake, plan)
    for row in rows:
        row["outcome"] = outcomes.get(row["run_id"], "not run")
        if row["status"] == "pending" and row["outcome"] != "not run":
            row["status"] = REMOVED  # it ran here, but its run is gone: removed (`ragen runs rm`) since
    return {"sweep_id": plan.sweep_id, "data_root": root_address(lake.root), "points": rows}


__all__ = [
    "COMPARISON_SCHEMA",
    "COMPARISON_SQL",
    "COMPARISON_TABLES",
    "DEFAULT_MAX_POINTS",
    "DISTRIBUTIONS",
    "REMOVED",
    "SWEEP_ID_MAX_LENGTH",
    "RandomSpec",
    "SweepError",
    "SweepPlan",
    "SweepPoint",
    "SweepRequest",
    "check_size",
    "compare_sweep",
    "parse_grid",
    "parse_random",
    "parse_seeds",
    "plan_sweep",
    "read_sweep",
    "record_sweep",
    "run_sweep",
    "sweep_file",
    "sweep_request",
    "with_sweep_id",
]
