"""Lake benchmark: write one million turns through the lake's write path, then time every worked query of
docs/sql.md over them, before and after compacting the runs.

    nice .venv/bin/python -m benchmarks.lake_bench            # ~200k trajectories x 5 turns, two runs
    nice .venv/bin/python -m benchmarks.lake_bench --turns 100000 --no-report   # a quick look

The write path is the one the flow uses: each batch is staged (``DataLake.stage_table``: trajectories and turns of
the rollout stage, then of the validation stage) and published by atomic renames; the small tables (metrics,
evaluations) go through ``DataLake.write_rows`` (contract check + publish); then the commit marker. Generating the
rows is timed apart and not counted. Writes ``benchmarks/results/lake.json`` and the "Trajectory lake" section of
``benchmarks/RESULTS.md``. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import replace_marked_section
from benchmarks.lake_synth import BatchShape, grids, make_batch
from ragen_core.storage import DataLake, connect, evaluation_rows, query
from ragen_core.storage.maintenance import compact_run
from ragen_core.storage.sqldoc import named_queries
from schemas.manifest import RunManifest

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "sql.md"
RUN_IDS = ("sweep-a", "sweep-b")  # the ids docs/sql.md's sweep comparison names
METRIC_NAMES = [f"bench/metric_{k:02d}" for k in range(18)] + ["rollout/reward_mean", "val/sokoban/success"]


def _split(table: pa.Table, split: str) -> pa.Table:
    return table.filter(pc.equal(table["split"], split))


def _write_batch(lake: DataLake, run_id: str, iteration: int, trajectories: pa.Table, turns: pa.Table) -> float:
    """Stage and publish one batch as the flow does (rollout stage, then the validation stage); seconds taken."""
    started = time.perf_counter()
    for stage, split in (("rollout", "train"), ("eval-sokoban", "val")):
        lake.stage_table(run_id, iteration, stage, "trajectories", _split(trajectories, split))
        lake.stage_table(run_id, iteration, stage, "turns", _split(turns, split))
        lake.publish(run_id, iteration, stage)
    return time.perf_counter() - started


def _write_small_tables(lake: DataLake, run_id: str, iteration: int, trajectories: pa.Table) -> float:
    started = time.perf_counter()
    train, val = _split(trajectories, "train"), _split(trajectories, "val")
    values = dict.fromkeys(METRIC_NAMES, 1.0)
    values["rollout/reward_mean"] = pc.mean(train["total_reward"]).as_py()
    values["val/sokoban/success"] = pc.mean(pc.cast(val["success"], pa.float64())).as_py()
    rows = [{"run_id": run_id, "iteration": iteration, "name": k, "value": v} for k, v in values.items()]
    lake.write_rows("metrics", run_id, iteration, rows, stage="commit", publish=False)
    lake.write_rows("evaluations", run_id, iteration, evaluation_rows(val), stage="commit", publish=False)
    lake.publish(run_id, iteration, "commit")
    lake.commit_iteration(run_id, iteration, {"metrics": len(rows)})
    return time.perf_counter() - started


def _manifest(run_id: str, ratio: float) -> RunManifest:
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    config = {"seed": 0, "env": {"name": "sokoban"}, "algorithm": {"filter_ratio": ratio}}
    return RunManifest(
        run_id=run_id,
        config=config,
        config_hash=f"bench-{run_id}",
        seed=0,
        status="completed",
        created_at=now,
        updated_at=now,
    )


def write_lake(lake: DataLake, shape: BatchShape, iterations: int, seed: int) -> dict[str, Any]:
    """Write ``len(RUN_IDS) x iterations`` batches; return row counts, bytes and timings."""
    rng, pool = np.random.default_rng(seed), grids(seed)
    totals = {
        "trajectories": 0,
        "turns": 0,
        "tokens": 0,
        "arrow_bytes": 0,
        "generate_s": 0.0,
        "write_s": 0.0,
        "small_s": 0.0,
    }
    for ratio, run_id in zip((0.25, 1.0), RUN_IDS, strict=True):
        lake.write_manifest(run_id, _manifest(run_id, ratio))
        for iteration in range(iterations):
            started = time.perf_counter()
            trajectories, turns = make_batch(rng, run_id, iteration, shape, pool)
            totals["generate_s"] += time.perf_counter() - started
            totals["write_s"] += _write_batch(lake, run_id, iteration, trajectories, turns)
            totals["small_s"] += _write_small_tables(lake, run_id, iteration, trajectories)
            totals["trajectories"] += trajectories.num_rows
            totals["turns"] += turns.num_rows
            totals["arrow_bytes"] += trajectories.nbytes + turns.nbytes
            totals["tokens"] += pc.sum(pc.list_value_length(trajectories["input_ids"])).as_py()
    files = [f for t in ("trajectories", "turns") for f in lake.partition_files(t)]
    totals["parquet_bytes"] = sum(f.stat().st_size for f in files)
    totals["parquet_files"] = len(files)
    return totals


def time_queries(lake: DataLake, queries: dict[str, str], repeat: int) -> dict[str, dict[str, float]]:
    """Each query ``repeat`` times, cold (a fresh connection and file listing each time, as ``ragen sql``)."""
    timings = {}
    for name, sql in queries.items():
        seconds, rows = [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            rows = query(lake, sql).num_rows
            seconds.append(time.perf_counter() - started)
        timings[name] = {"rows": rows, "min_s": min(seconds), "median_s": statistics.median(seconds)}
    return timings


def time_connect(lake: DataLake, repeat: int) -> float:
    """Median seconds to open a connection: list every table's files, read their schema versions, create views."""
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        connect(lake).close()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _environment() -> dict[str, Any]:
    versions = {p: metadata.version(p) for p in ("duckdb", "pyarrow", "numpy")}
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": round(os.getloadavg()[0], 2),
        **versions,
    }


def batch_shape(turns: int, iterations: int, turns_per_trajectory: int) -> BatchShape:
    """The per-iteration batch that writes ``turns`` turns in all over ``len(RUN_IDS) x iterations`` batches."""
    turns_per_batch = turns // (len(RUN_IDS) * iterations)
    trajectories = turns_per_batch // turns_per_trajectory
    val = max(2, trajectories // 25)
    if (trajectories - val) // 16 < 1:
        raise ValueError(
            f"{turns} turns over {len(RUN_IDS)} x {iterations} batches leave fewer than one group of 16 per batch; "
            "write more turns or fewer iterations"
        )
    return BatchShape((trajectories - val) // 16, 16, val // 2, 2, turns_per_trajectory)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark of the command line's arguments."""
    return measure(
        args.turns,
        args.iterations,
        args.turns_per_trajectory,
        args.repeat,
        args.seed,
        Path(args.root) if args.root else None,
        args.keep,
    )


def measure(
    turns: int,
    iterations: int = 50,
    turns_per_trajectory: int = 5,
    repeat: int = 3,
    seed: int = 0,
    root: Path | None = None,
    keep: bool = False,
    compact: bool = True,
) -> dict[str, Any]:
    """Write ``turns`` turns through the lake's write path, time every documented query (and, with ``compact``,
    compact both runs and time them again); the data root is deleted afterwards unless ``keep``."""
    environment = _environment()
    shape = batch_shape(turns, iterations, turns_per_trajectory)
    root = root or Path(tempfile.mkdtemp(prefix="lake-bench-"))
    lake = DataLake(root)
    queries = named_queries(DOC.read_text())
    queries = {"count_turns": "SELECT count(*) FROM turns", **queries}
    try:
        written = write_lake(lake, shape, iterations, seed)
        before = time_queries(lake, queries, repeat)
        connect_before = time_connect(lake, repeat)
        compaction, after, connect_after = {}, before, connect_before
        if compact:
            started = time.perf_counter()
            merged = sum(len(compact_run(lake, run_id).compacted) for run_id in RUN_IDS)
            files_after = len(lake.partition_files("trajectories")) + len(lake.partition_files("turns"))
            compaction = {"seconds": time.perf_counter() - started, "partitions": merged, "files_after": files_after}
            after = time_queries(lake, queries, repeat)
            connect_after = time_connect(lake, repeat)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    write_s = written["write_s"]
    return {
        "environment": environment,
        "shape": {"runs": len(RUN_IDS), "iterations": iterations, **vars(shape)},
        "write": {
            **written,
            "turns_per_s": written["turns"] / write_s,
            "trajectories_per_s": written["trajectories"] / write_s,
            "rows_per_s": (written["turns"] + written["trajectories"]) / write_s,
            "arrow_mb_per_s": written["arrow_bytes"] / 1e6 / write_s,
            "parquet_mb_per_s": written["parquet_bytes"] / 1e6 / write_s,
        },
        "queries_before_compaction": before,
        "compaction": compaction,
        "queries_after_compaction": after,
        "connect_s": {"before_compaction": connect_before, "after_compaction": connect_after},
    }


def markdown(result: dict[str, Any]) -> str:
    """The "Trajectory lake" section of RESULTS.md."""
    w, env, shape, compaction = result["write"], result["environment"], result["shape"], result["compaction"]
    lines = [
        "## Trajectory lake (`benchmarks/lake_bench.py`)",
        "",
        f"{w['turns']:,} turns in {w['trajectories']:,} trajectories ({shape['runs']} runs x "
        f"{shape['iterations']} iterations, {shape['turns']} turns each, ~{w['tokens'] / w['trajectories']:.0f} "
        f"tokens per trajectory); {env['cpus']} CPUs (load average {env['load_average_at_start']} at the start), "
        f"Python {env['python']}, DuckDB {env['duckdb']}, pyarrow {env['pyarrow']}.",
        "",
        "| write path (stage + publish, zstd) | value |",
        "|---|---|",
        f"| turns / s | {w['turns_per_s']:,.0f} |",
        f"| trajectories / s | {w['trajectories_per_s']:,.0f} |",
        f"| rows / s (both tables) | {w['rows_per_s']:,.0f} |",
        f"| Arrow MB / s (in memory) | {w['arrow_mb_per_s']:,.1f} |",
        f"| Parquet MB / s (on disk) | {w['parquet_mb_per_s']:,.1f} |",
        f"| on disk | {w['parquet_bytes'] / 1e6:,.0f} MB in {w['parquet_files']} files "
        f"({w['arrow_bytes'] / w['parquet_bytes']:.1f}x smaller than Arrow) |",
        f"| write time | {w['write_s']:.1f} s (+ {w['small_s']:.1f} s metrics/evaluations/commits, "
        f"{w['generate_s']:.1f} s generating rows, not counted) |",
        "",
        f"Compaction of both runs (`ragen runs compact`): {compaction['partitions']} partitions merged in "
        f"{compaction['seconds']:.1f} s ({w['parquet_files']} -> {compaction['files_after']} files).",
        "",
        "| query (docs/sql.md) | rows | median s, before compaction | median s, after |",
        "|---|---|---|---|",
    ]
    after = result["queries_after_compaction"]
    for name, timing in result["queries_before_compaction"].items():
        lines.append(f"| `{name}` | {timing['rows']} | {timing['median_s']:.3f} | {after[name]['median_s']:.3f} |")
    connect_s = result["connect_s"]
    lines += [
        "",
        "Each query runs cold, as `ragen sql` does: a fresh connection, file listing and views every time; opening "
        f"the connection alone takes {connect_s['before_compaction']:.3f} s before compaction, "
        f"{connect_s['after_compaction']:.3f} s after.",
    ]
    return "\n".join(lines) + "\n"


def update_results(path: Path, section: str) -> None:
    """Replace (or append) this benchmark's section of RESULTS.md."""
    replace_marked_section(path, "<!-- lake_bench:begin -->", "<!-- lake_bench:end -->", section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1_000_000, help="Turns to write in all.")
    parser.add_argument("--turns-per-trajectory", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=50, help="Iterations per run (two runs).")
    parser.add_argument("--repeat", type=int, default=3, help="Timed repetitions of each query.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", help="Data root to write (default: a temporary folder, deleted afterwards).")
    parser.add_argument("--keep", action="store_true", help="Keep the data root.")
    parser.add_argument("--no-report", action="store_true", help="Print only; do not write the results files.")
    args = parser.parse_args()
    result = run(args)
    section = markdown(result)
    print(section)
    if not args.no_report:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "lake.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        update_results(HERE / "RESULTS.md", section)


if __name__ == "__main__":
    main()
