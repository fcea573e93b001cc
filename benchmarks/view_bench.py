"""Viewer benchmark: the time of each page of ``ragen view`` on a lake of a million trajectories.

A synthetic lake (benchmarks/lake_synth.py's Sokoban-like rows, written through the lake's write path by
benchmarks/lake_bench.py: 2 runs x ``iterations`` iterations) is served by ``ragen view`` started as users start it,
and each page is fetched over HTTP on loopback ``repeat`` times; the median and the largest of its times are kept.
The pages are the ones a person opens in a row (runs, a run, an iteration, the iteration filtered and sorted on its
last page, a trajectory in each colouring) plus the search of one env seed across the whole lake, which is the one
page that reads every run's trajectories (its key columns). The lake's rows have no tokenizer (their ids are random),
so tokens are shown as ids: decoding a trajectory's few hundred tokens is not part of these times.

    python -m benchmarks.view_bench                          # 1,000,000 trajectories (~2.5 minutes to write)
    python -m benchmarks.view_bench --trajectories 20000 --no-report
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import HERE
from benchmarks.lake_bench import RUN_IDS, _environment, write_lake
from benchmarks.lake_synth import BatchShape
from ragen_core.storage import DataLake, query
from ragen_view.server import spawn

TARGET_S = 1.0  # issue 52: a page of a 1M-trajectory lake opens in under a second


def shape_for(trajectories: int, iterations: int, turns: int) -> BatchShape:
    """A batch (groups of 16 and 2% validation) such that ``len(RUN_IDS) x iterations`` batches hold about
    ``trajectories`` trajectories."""
    per_batch = trajectories // (len(RUN_IDS) * iterations)
    val = max(2, per_batch // 50) // 2 * 2
    groups = (per_batch - val) // 16
    if groups < 1:
        raise ValueError(
            f"{trajectories} trajectories over {len(RUN_IDS)} x {iterations} batches leave no group of 16"
        )
    return BatchShape(groups, 16, val // 2, 2, turns)


def pages(lake: DataLake, iterations: int) -> dict[str, str]:
    """The pages to time (paths), their trajectories picked by queries of the lake."""
    run_id, iteration = RUN_IDS[0], iterations // 2
    failed = query(
        lake,
        "SELECT group_id, traj_index, env_seed FROM trajectories WHERE split = 'train' AND NOT "
        "success AND kept ORDER BY group_id LIMIT 1",
        run_id=run_id,
        iteration=iteration,
        tables=("trajectories",),
    ).to_pylist()[0]
    key = f"split=train&env=sokoban&group={failed['group_id']}&traj={failed['traj_index']}"
    base = f"/runs/{run_id}/iterations/{iteration}"
    return {
        "runs": "/",
        "run": f"/runs/{run_id}",
        "iteration": base,
        "iteration_filtered": f"{base}?split=train&success=no&sort=reward&desc=1&page_no=40"
        "&where=num_actions+%3E+1+AND+group_reward_std+%3E+0",
        "trajectory_mask": f"{base}/trajectory?{key}",
        "trajectory_logprob": f"{base}/trajectory?{key}&colour=logprob",
        "trajectory_advantage": f"{base}/trajectory?{key}&colour=advantage",
        "seed_search_whole_lake": f"/seed?env=sokoban&seed={failed['env_seed']}",
    }


def time_pages(root: Path, paths: dict[str, str], repeat: int) -> dict[str, dict[str, float]]:
    """Each page fetched ``repeat`` times (after one untimed fetch that loads the app's imports), by name."""
    process, printed = spawn(root, cwd=HERE.parent)
    url = printed.split("/?", 1)[0]
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())  # the cookie of the token's visit
    try:
        with opener.open(printed, timeout=300) as answer:
            answer.read()
        timings = {}
        for name, path in paths.items():
            with opener.open(url + path, timeout=300) as answer:  # warm-up: imports, tokenizer cache, filter server
                answer.read()
            seconds = []
            for _ in range(repeat):
                started = time.perf_counter()
                with opener.open(url + path, timeout=300) as answer:
                    body = answer.read()
                    if answer.status != 200 or b'id="error"' in body:
                        raise RuntimeError(f"page {name} ({path}) failed: {body[-1500:]!r}")
                seconds.append(time.perf_counter() - started)
            timings[name] = {"median_s": statistics.median(seconds), "max_s": max(seconds), "bytes": len(body)}
        return timings
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def measure(
    trajectories: int = 1_000_000,
    iterations: int = 50,
    turns: int = 2,
    repeat: int = 5,
    seed: int = 0,
    root: Path | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Write the lake, time its pages; the data root is deleted afterwards unless ``keep``."""
    environment = _environment()
    shape = shape_for(trajectories, iterations, turns)
    root = root or Path(tempfile.mkdtemp(prefix="view-bench-"))
    lake = DataLake(root)
    try:
        written = write_lake(lake, shape, iterations, seed)
        paths = pages(lake, iterations)
        timings = time_pages(root, paths, repeat)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    browsing = {name: t for name, t in timings.items() if name != "seed_search_whole_lake"}
    return {
        "environment": environment,
        "shape": {"runs": len(RUN_IDS), "iterations": iterations, **vars(shape)},
        "lake": {
            "trajectories": written["trajectories"],
            "turns": written["turns"],
            "parquet_bytes": written["parquet_bytes"],
            "parquet_files": written["parquet_files"],
        },
        "paths": paths,
        "pages": timings,
        "page_max_median_s": max(t["median_s"] for t in browsing.values()),
        "target_s": TARGET_S,
    }


def markdown(result: dict[str, Any]) -> str:
    """The viewer's section of RESULTS.md."""
    lake, env = result["lake"], result["environment"]
    lines = [
        "## Rollout viewer (`benchmarks/view_bench.py`)",
        "",
        f"`ragen view` over {lake['trajectories']:,} trajectories ({lake['turns']:,} turns, "
        f"{lake['parquet_bytes'] / 1e6:,.0f} MB in {lake['parquet_files']} Parquet files; 2 runs x "
        f"{result['shape']['iterations']} iterations), each page fetched over HTTP on loopback after one warm-up "
        f"fetch; {env['cpus']} CPUs (load average {env['load_average_at_start']} at the start), DuckDB "
        f"{env['duckdb']}.",
        "",
        "| page | median s | max s |",
        "|---|---|---|",
    ]
    for name, timing in result["pages"].items():
        lines.append(f"| {name} | {timing['median_s']:.3f} | {timing['max_s']:.3f} |")
    lines += [
        "",
        f"Slowest browsing page (median): {result['page_max_median_s']:.3f} s (target: under {TARGET_S:g} s). The "
        "seed search reads the key columns of every run's trajectories and is not a browsing page.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=50, help="Iterations per run (two runs).")
    parser.add_argument("--turns", type=int, default=2, help="Turns per trajectory.")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--root", help="Data root to write (default: a temporary folder, deleted afterwards).")
    parser.add_argument("--keep", action="store_true", help="Keep the data root.")
    parser.add_argument("--no-report", action="store_true", help="Print only; do not write the results files.")
    args = parser.parse_args()
    result = measure(
        args.trajectories,
        args.iterations,
        args.turns,
        args.repeat,
        root=Path(args.root) if args.root else None,
        keep=args.keep,
    )
    print(markdown(result))
    if not args.no_report:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "view.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
