"""``python -m benchmarks.expert_bench``: how often each environment's scripted expert solves its instances.

    python -m benchmarks.expert_bench                         # every env with an expert, seeds 0..199
    python -m benchmarks.expert_bench --envs game_2048 --jobs 2
    python -m benchmarks.expert_bench --envs sudoku --options difficulty=hard --seeds 50

Each instance is played from ``reset(seed)`` with the expert's plans (cut to the remaining action budget, re-planned
whenever a plan runs out), until the episode ends or the budget is spent; success is the env's own flag. The budget is
the env's own step limit where it has one, else the trajectory budget of ``BUDGETS`` (RAGEN-2's 700 actions for 2048).
The table gives the success count, the actions played (mean and max), the seconds per instance and, for 2048, the
distribution of the largest tile. The fast tests keep a few seeds of each; this is the full measurement that
docs/environments.md quotes. Plays are deterministic (every env draws from its seed), so reruns give the same counts;
only the seconds vary.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from ragen_core.envs import make_env, registered_envs
from ragen_core.envs.dataset import DATASET_ENV

# Action budget per trajectory for envs without their own step limit (RAGEN-2 gives 2048 700 actions).
BUDGETS = {"game_2048": 700}
DEFAULT_BUDGET = 100


@dataclass(frozen=True)
class Play:
    """One instance played by the expert."""

    seed: int
    success: bool
    actions: int
    seconds: float
    max_tile: int | None  # 2048 only


def budget_of(env: Any, name: str) -> int:
    """The actions an instance may take: the env's own step limit where it has one, else ``BUDGETS``."""
    own = getattr(env, "max_steps", None)
    return int(own) if own else BUDGETS.get(name, DEFAULT_BUDGET)


def play(name: str, options: dict[str, Any], seed: int) -> Play:
    """The expert's play of instance ``seed`` of env ``name`` (built with ``options``)."""
    env = make_env(name, **options)
    budget = budget_of(env, name)
    start = time.perf_counter()
    env.reset(seed)
    actions, done = 0, False
    while not done and actions < budget:
        plan = env.expert_plan(budget - actions)
        if not plan:
            break
        for action in plan[: budget - actions]:
            _, _, terminated, truncated, _ = env.step(action)
            actions += 1
            if terminated or truncated:
                done = True
                break
    grid = getattr(env, "grid", None) if name == "game_2048" else None
    return Play(seed, bool(env.success), actions, time.perf_counter() - start, max(grid) if grid else None)


def _play_chunk(name: str, options: dict[str, Any], seeds: list[int]) -> list[Play]:
    return [play(name, options, seed) for seed in seeds]


def measure(name: str, options: dict[str, Any], seeds: int, jobs: int) -> list[Play]:
    """The plays of seeds ``0..seeds-1``, split over ``jobs`` processes (interleaved so the chunks cost alike)."""
    chunks = [list(range(j, seeds, jobs)) for j in range(jobs)]
    if jobs == 1:
        return _play_chunk(name, options, chunks[0])
    with ProcessPoolExecutor(jobs) as pool:
        parts = list(pool.map(_play_chunk, [name] * jobs, [options] * jobs, chunks))
    return sorted((p for part in parts for p in part), key=lambda p: p.seed)


def has_expert(name: str) -> bool:
    """Whether env ``name`` has a scripted expert (the base class refuses with NotImplementedError)."""
    env = make_env(name)
    env.reset(0)
    try:
        env.expert_plan(1)
    except NotImplementedError:
        return False
    return True


def summary_row(name: str, budget: int, plays: list[Play]) -> str:
    """One Markdown table row: env, solved of seeds, actions mean/max, seconds per instance, 2048's largest tiles."""
    solved = sum(p.success for p in plays)
    actions = [p.actions for p in plays]
    seconds = sum(p.seconds for p in plays) / len(plays)
    tiles = Counter(p.max_tile for p in plays if p.max_tile is not None)
    tile_text = ", ".join(f"{tile}: {count}" for tile, count in sorted(tiles.items(), reverse=True)) or "-"
    return (
        f"| {name} | {budget} | {solved}/{len(plays)} ({solved / len(plays):.1%}) | "
        f"{sum(actions) / len(actions):.1f} / {max(actions)} | {seconds:.3f} | {tile_text} |"
    )


def _parse_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--options takes key=value items, got {item!r}")
        for cast in (int, float):
            try:
                options[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            options[key] = {"true": True, "false": False}.get(value.lower(), value)
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.expert_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="", help="Comma-separated env names (default: every env with an expert).")
    parser.add_argument("--options", nargs="*", default=[], help="key=value env options, applied to every env.")
    parser.add_argument("--seeds", type=int, default=200, help="Instances per env: seeds 0..N-1 (default 200).")
    parser.add_argument("--jobs", type=int, default=1, help="Processes per env (default 1).")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1")
    # by default every env that builds without options (the dataset env needs a file of prompts: --options)
    names = [n.strip() for n in args.envs.split(",") if n.strip()] or [
        n for n in registered_envs() if n != DATASET_ENV
    ]
    unknown = sorted(set(names) - set(registered_envs()))
    if unknown:
        parser.error(f"unknown env(s) {', '.join(unknown)}; choose among {', '.join(registered_envs())}")
    without = [n for n in names if not has_expert(n)]
    if args.envs and without:
        parser.error(f"no scripted expert for {', '.join(without)}")
    names = [n for n in names if n not in without]
    try:
        options = _parse_options(args.options)
    except ValueError as error:
        parser.error(str(error))
    for name in names:  # bad options fail here, before any play
        try:
            make_env(name, **options)
        except (TypeError, ValueError) as error:
            print(f"error: env {name!r} refuses options {options}: {error}", file=sys.stderr)
            return 2
    print(f"Expert plays of seeds 0..{args.seeds - 1}{' with ' + str(options) if options else ''}\n")
    print("| env | action budget | solved | actions mean / max | s per instance | 2048 largest tile: games |")
    print("|---|---|---|---|---|---|")
    for name in names:
        budget = budget_of(make_env(name, **options), name)
        print(summary_row(name, budget, measure(name, options, args.seeds, args.jobs)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
