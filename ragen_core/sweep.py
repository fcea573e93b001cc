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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from ragen_core.config import ConfigError, RunConfig, load_yaml, parse_override
from ragen_core.run.checks import StoredConfig, build_run_config, build_stored_run_config
from ragen_core.run.entry import run_lake
from ragen_core.run.requests import ConfigInput, resolve_config
from ragen_core.seeding import derive_rng
from ragen_core.storage import DataLake, query
from ragen_core.storage.files import atomic_write_bytes
from ragen_core.storage.names import InvalidRunIdError, validate_run_id

DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")
DEFAULT_MAX_POINTS = 100  # runs one sweep may start unless --max-points allows more: 1,000 points is rarely meant
_RANDOM_PATTERN = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.DOTALL)


class SweepError(ValueError):
    """A sweep that cannot run as given (bad search syntax, a point with an invalid config, a clashing sweep id)."""


@dataclass(frozen=True)
class RandomSpec:
    """One randomly searched key: ``distribution`` over ``args`` (bounds, or the choices)."""

    key: str
    distribution: str
    args: list[Any]

    def sample(self, rng: Any) -> Any:
        """Draw one value with the numpy Generator ``rng``."""
        if self.distribution == "uniform":
            return float(rng.uniform(self.args[0], self.args[1]))
        if self.distribution == "loguniform":
            return float(math.exp(rng.uniform(math.log(self.args[0]), math.log(self.args[1]))))
        if self.distribution == "randint":
            return int(rng.integers(self.args[0], self.args[1], endpoint=True))
        return self.args[int(rng.integers(len(self.args)))]


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: its config validated once, when the sweep was planned, and handed on as it is."""

    index: int
    run_id: str
    overrides: list[str]
    config: RunConfig

    def to_dict(self) -> dict[str, Any]:
        """The point as the stored plan holds it (its config as plain values)."""
        return {
            "index": self.index,
            "run_id": self.run_id,
            "overrides": list(self.overrides),
            "config": self.config.to_dict(),
        }

    def manifest_entry(self, sweep_id: str) -> dict[str, Any]:
        """What the run's manifest records under ``sweep``."""
        return {"id": sweep_id, "point": self.index, "overrides": list(self.overrides)}


@dataclass(frozen=True)
class SweepPlan:
    """The expanded sweep: its id, the spec it came from and its points."""

    sweep_id: str
    spec: dict[str, Any]
    points: list[SweepPoint] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The plan as it is stored under the data root."""
        return {"sweep_id": self.sweep_id, "spec": self.spec, "points": [p.to_dict() for p in self.points]}


def _numeric(value: Any) -> Any:
    """YAML 1.1 reads ``1e-4`` (no dot) as a string: take such strings as the numbers users meant."""
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value.strip()):
        return float(value)
    return value


def parse_grid(text: str) -> tuple[str, list[Any]]:
    """``key=[v1,v2,...]`` -> (key, values). The values are YAML, like config overrides."""
    path, value = _split(text, "--grid", "algorithm.filter_ratio=[0.25,0.5,1.0]")
    values = [_numeric(v) for v in (value if isinstance(value, list) else [value])]
    if not values:
        raise SweepError(f"--grid {text!r} has no values; give at least one, e.g. {'.'.join(path)}=[1,2]")
    if any(isinstance(v, dict) for v in values):
        raise SweepError(f"--grid {text!r}: values must be scalars or lists, not mappings")
    return ".".join(path), values


def parse_random(text: str) -> RandomSpec:
    """``key=dist(args)`` -> :class:`RandomSpec` (dist: uniform, loguniform, randint, choice)."""
    if "=" not in text:
        raise SweepError(f"--random {text!r} must look like key=dist(args), e.g. actor.lr=loguniform(1e-4,1e-2)")
    key, raw = text.split("=", 1)
    match = _RANDOM_PATTERN.match(raw)
    if not key.strip() or match is None or match.group(1) not in DISTRIBUTIONS:
        raise SweepError(
            f"--random {text!r} must look like key=dist(args) with dist one of {', '.join(DISTRIBUTIONS)}, "
            "e.g. actor.lr=loguniform(1e-4,1e-2) or algorithm.estimator=choice([grpo,gae])"
        )
    name, inner = match.group(1), match.group(2)
    try:
        args = [_numeric(a) for a in load_yaml(f"[{inner}]", f"the arguments of --random {text!r}")]
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    if name == "choice":
        choices = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if not choices:
            raise SweepError(f"--random {text!r}: choice needs at least one value")
        return RandomSpec(key.strip(), name, list(choices))
    if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        raise SweepError(f"--random {text!r}: {name} takes two numbers (low, high)")
    low, high = args
    if low > high or (name == "loguniform" and low <= 0):
        raise SweepError(f"--random {text!r}: need low <= high" + (" and low > 0" if name == "loguniform" else ""))
    if name == "randint" and not all(isinstance(a, int) for a in args):
        raise SweepError(f"--random {text!r}: randint takes two integers")
    return RandomSpec(key.strip(), name, [low, high])


def parse_seeds(value: int | str | list[int] | None) -> list[int]:
    """``3`` -> [0, 1, 2]; ``"0,7,42"`` or [0, 7, 42] -> those seeds; None -> [] (the base config's seed)."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        seeds = value
    elif isinstance(value, int) or str(value).strip().isdigit():
        count = int(value)
        if not 1 <= count <= DEFAULT_MAX_POINTS * 100:  # a count is expanded into a list: bounded before that
            raise SweepError(
                f"--seeds {value!r}: give a count from 1 to {DEFAULT_MAX_POINTS * 100} or a "
                "comma-separated list of seeds"
            )
        return list(range(count))
    else:
        try:
            seeds = [int(part) for part in str(value).split(",") if part.strip()]
        except ValueError:
            raise SweepError(f"--seeds {value!r}: give a count (3) or a comma-separated list (0,7,42)") from None
    if len(set(seeds)) != len(seeds) or not seeds:
        raise SweepError(f"--seeds {value!r}: seeds must be distinct and at least one")
    return [int(s) for s in seeds]


def plan_sweep(
    base: RunConfig | dict[str, Any],
    grid: list[str] | None = None,
    random: list[str] | None = None,
    samples: int = 0,
    seeds: int | str | list[int] | None = None,
    sweep_id: str | None = None,
    search_seed: int = 0,
    max_points: int = DEFAULT_MAX_POINTS,
) -> SweepPlan:
    """Expand grid x random samples x seeds into points, each validated as a full config before anything runs.

    ``base`` is a config (used as it is) or a config tree (validated here; it may already carry the user's fixed
    overrides); each point's config is validated once, the base's own point (no overrides) not again. The sweep id
    defaults to ``sweep-<hash of the spec>``, so the same command names the same runs. A search of more than
    ``max_points`` points is refused from its size alone, before anything is expanded.
    """
    grid_axes = [parse_grid(text) for text in grid or []]
    random_axes = [parse_random(text) for text in random or []]
    if random_axes and samples < 1:
        raise SweepError("--random needs --samples N (draws per grid combination), N >= 1")
    if samples and not random_axes:
        raise SweepError("--samples only applies with --random key=dist(...)")
    check_size(grid_axes, samples, parse_seeds(seeds), max_points)
    keys = [k for k, _ in grid_axes] + [r.key for r in random_axes] + (["seed"] if seeds else [])
    if len(set(keys)) != len(keys):
        raise SweepError(f"a key is searched twice: {sorted(k for k in keys if keys.count(k) > 1)}")
    if "algorithm.preset" in keys:  # the base config is resolved first: its clip, KL and filter are explicit by then
        raise SweepError(
            "algorithm.preset cannot be a sweep axis: the base config's algorithm keys are already set from its "
            "preset, so the axis would change nothing. Run one sweep per preset (add algorithm.preset=starpo to the "
            "command), sweep the keys a preset sets (algorithm.clip_high, algorithm.kl_coef, algorithm.filter_ratio), "
            "or use `ragen reproduce echo_trap` (StarPO against StarPO-S)"
        )
    base_config = base if isinstance(base, RunConfig) else _validated(base, [], "the base config")
    spec = {
        "base_config_hash": base_config.config_hash(),
        "grid": [[k, v] for k, v in grid_axes],
        "random": [asdict(r) for r in random_axes],
        "samples": samples,
        "seeds": parse_seeds(seeds),
        "search_seed": search_seed,
    }
    sweep_id = "sweep-" + _digest(spec)[:8] if sweep_id is None else sweep_id  # '' is refused, not replaced
    _check_id(sweep_id)
    points = []
    for overrides in _combinations(grid_axes, random_axes, samples, spec["seeds"], search_seed):
        index = len(points)
        run_id = validate_run_id(f"{sweep_id}-p{index:03d}")
        what = f"point {index} ({' '.join(overrides)})"
        config = _validated(base_config.to_dict(), overrides, what) if overrides else base_config
        points.append(SweepPoint(index, run_id, overrides, config))
    return SweepPlan(sweep_id, spec, points)


def with_sweep_id(plan: SweepPlan, sweep_id: str) -> SweepPlan:
    """``plan`` under another sweep id, its points renamed ``<sweep id>-p<NNN>`` (as :func:`plan_sweep` with that
    ``sweep_id`` names them); no config is validated again."""
    _check_id(sweep_id)
    points = [replace(p, run_id=validate_run_id(f"{sweep_id}-p{p.index:03d}")) for p in plan.points]
    return replace(plan, sweep_id=sweep_id, points=points)


def check_size(grid_axes: list[tuple[str, list[Any]]], samples: int, seeds: list[int], max_points: int) -> int:
    """The number of points of a search (grid combinations x samples x seeds), computed without expanding it; more
    than ``max_points`` raises a :class:`SweepError` saying how to allow it."""
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise SweepError(f"--max-points must be a positive integer, not {max_points!r}")
    factors = [len(values) for _, values in grid_axes] + [max(samples, 1), max(len(seeds), 1)]
    points = math.prod(factors)
    if points > max_points:
        shape = " x ".join(str(f) for f in factors if f > 1) or "1"
        raise SweepError(
            f"the sweep has {points:,} points ({shape}), more than --max-points {max_points:,}; narrow the search, "
            f"or pass --max-points {points} to run them all"
        )
    return points


def _combinations(grid_axes, random_axes, samples, seeds, search_seed) -> list[list[str]]:
    grid_points = list(itertools.product(*[[(k, v) for v in values] for k, values in grid_axes])) or [()]
    result = []
    for combo_index, combo in enumerate(grid_points):
        draws: list[list[tuple[str, Any]]] = [[]]
        if random_axes:
            draws = []
            for sample in range(samples):
                rng = derive_rng(search_seed, "sweep-random", combo_index, sample)
                draws.append([(r.key, r.sample(rng)) for r in random_axes])
        for draw in draws:
            overrides = [_override(k, v) for k, v in [*combo, *draw]]
            result += [overrides + [f"seed={s}"] for s in seeds] if seeds else [overrides]
    return result


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: the override parser reads it back exactly


def _split(text: str, flag: str, example: str) -> tuple[list[str], Any]:
    try:
        return parse_override(text)
    except ConfigError as exc:
        raise SweepError(f"{flag} {text!r}: {exc} (e.g. {example})") from None


def _validated(tree: dict[str, Any], overrides: list[str], what: str) -> RunConfig:
    try:
        return build_run_config(tree, overrides)
    except ConfigError as exc:
        raise SweepError(f"{what} is not a valid config: {exc}") from None


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


SWEEP_ID_MAX_LENGTH = 81  # leaves room for the points' suffix (-p<NNN>) within the run-id length


def _check_id(sweep_id: str) -> str:
    """A sweep id prefixes its points' run ids, so it is a run-id name (:mod:`ragen_core.storage.names`) with room
    for the ``-p<NNN>`` suffix; never a pattern or a path."""
    try:
        validate_run_id(sweep_id, "sweep id")
    except InvalidRunIdError as exc:
        raise SweepError(str(exc)) from None
    if len(sweep_id) > SWEEP_ID_MAX_LENGTH or not sweep_id[0].isalnum():
        raise SweepError(
            f"sweep id {sweep_id!r}: use 1 to {SWEEP_ID_MAX_LENGTH} letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (its points are named <sweep id>-p<NNN>)"
        )
    return sweep_id


def sweep_file(lake: DataLake, sweep_id: str) -> Path:
    """Where a sweep's plan is stored (the lake's sweep folder)."""
    return lake.sweep_file(_check_id(sweep_id))


def record_sweep(lake: DataLake, plan: SweepPlan) -> Path:
    """Store the plan (atomically). The same id with another spec is refused: the runs would mix two sweeps."""
    path = sweep_file(lake, plan.sweep_id)
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("spec") != plan.spec:
            raise SweepError(
                f"sweep id {plan.sweep_id!r} already names another sweep in {lake.root} (different base config, "
                "search or seeds); choose another --sweep-id, or drop --sweep-id to get one derived from the spec"
            )
        return path
    atomic_write_bytes(path, (json.dumps(plan.to_dict(), indent=1, sort_keys=True) + "\n").encode())
    return path


def read_sweep(lake: DataLake, sweep_id: str, trusted_kinds: frozenset[str] = frozenset()) -> SweepPlan:
    """The stored plan of ``sweep_id``, its points' configs built as configs read from the data root are: a program or
    outside folder one names is refused (:func:`ragen_core.run.checks.build_stored_run_config`), as
    :class:`SweepError` (``trusted_kinds``: kinds of keys the user allows, ``{"module"}`` for the environments'
    modules)."""
    path = sweep_file(lake, sweep_id)
    if not path.is_file():
        raise SweepError(f"no sweep {sweep_id!r} in {lake.root} (looked for {path})")
    stored = json.loads(path.read_text())
    source = str(path.relative_to(lake.root))
    try:
        points = [
            SweepPoint(
                p["index"],
                p["run_id"],
                p["overrides"],
                build_stored_run_config(StoredConfig(p["config"], source, lake.root), [], trusted_kinds),
            )
            for p in stored["points"]
        ]
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    return SweepPlan(stored["sweep_id"], stored["spec"], points)


COMPARISON_SQL = """
WITH finals AS (
    SELECT run_id, max(iteration) AS last_iteration FROM metrics GROUP BY run_id
), validation AS (
    SELECT e.run_id, avg(e.success_rate) AS val_success
    FROM evaluations e JOIN finals f ON e.run_id = f.run_id AND e.iteration = f.last_iteration
    GROUP BY e.run_id
), first_validation AS (
    SELECT run_id, avg(success_rate) AS val_success_first
    FROM evaluations WHERE iteration = 0 GROUP BY run_id
), rewards AS (
    SELECT run_id, arg_max(value, iteration) AS final_reward
    FROM metrics WHERE name = 'rollout/reward_mean' GROUP BY run_id
), collapse AS (
    SELECT run_id, count(*) AS collapse_events FROM events WHERE kind = 'early_warning' GROUP BY run_id
)
SELECT r.run_id, r.sweep_point AS point, r.status, r.iterations_done, v0.val_success_first, v.val_success,
       w.final_reward, coalesce(c.collapse_events, 0) AS collapse_events
FROM runs r
LEFT JOIN validation v USING (run_id)
LEFT JOIN first_validation v0 USING (run_id)
LEFT JOIN rewards w USING (run_id)
LEFT JOIN collapse c USING (run_id)
WHERE r.sweep_id = $sweep_id
"""

COMPARISON_TABLES = ("runs", "metrics", "evaluations", "events")  # the tables it reads: views of these alone

COMPARISON_SCHEMA = pa.schema(
    [
        ("point", pa.int32()),
        ("run_id", pa.string()),
        ("overrides", pa.string()),
        ("status", pa.string()),
        ("iterations_done", pa.int32()),
        ("val_success_first", pa.float64()),
        ("val_success", pa.float64()),
        ("final_reward", pa.float64()),
        ("collapse_events", pa.int64()),
    ]
)


def compare_sweep(lake: DataLake, plan: SweepPlan) -> pa.Table:
    """One row per point: status, validation success before RL (iteration 0) and at the last committed iteration
    (mean over the validation envs), the last training iteration's mean reward, and Echo-Trap warnings.

    Points that never started have status ``pending`` and nulls."""
    stored = query(lake, COMPARISON_SQL, params={"sweep_id": plan.sweep_id}, tables=COMPARISON_TABLES)
    found = {row["run_id"]: row for row in stored.to_pylist()}
    rows = []
    for point in plan.points:
        row = found.get(point.run_id, {})
        rows.append(
            {
                "point": point.index,
                "run_id": point.run_id,
                "overrides": " ".join(point.overrides),
                "status": row.get("status", "pending"),
                "iterations_done": row.get("iterations_done", 0),
                "val_success_first": row.get("val_success_first"),
                "val_success": row.get("val_success"),
                "final_reward": row.get("final_reward"),
                "collapse_events": row.get("collapse_events", 0),
            }
        )
    return pa.Table.from_pylist(rows, schema=COMPARISON_SCHEMA)


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

    def chosen(self) -> list[SweepPoint]:
        """The points this request runs, in the plan's order."""
        return [p for p in self.plan.points if self.points is None or p.index in set(self.points)]

    def parameters(self) -> dict[str, Any]:
        """The request as the ``sweep`` flow's plain parameters."""
        return {
            "config": self.base.to_dict(),
            "data_root": str(self.lake.root),
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
    rows = compare(lake, plan)
    for row in rows:
        row["outcome"] = outcomes.get(row["run_id"], "not run")
        if row["status"] == "pending" and row["outcome"] != "not run":
            row["status"] = REMOVED  # it ran here, but its run is gone: removed (`ragen runs rm`) since
    return {"sweep_id": plan.sweep_id, "data_root": str(Path(lake.root).resolve()), "points": rows}
