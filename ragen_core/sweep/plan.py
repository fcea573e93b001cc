"""A sweep's plan: the search syntax (grid, random draws, seeds) expanded into points, each an ordinary run's
config validated once, under a sweep id derived from the spec (:func:`plan_sweep`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ragen_core.config import ConfigError, RunConfig, load_yaml, parse_override
from ragen_core.run.checks import build_run_config
from ragen_core.seeding import derive_rng
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
