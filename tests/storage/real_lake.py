"""A real lake for the tests of the other tools' readers, the layout upgrade and `ragen export`: two tiny Bandit
runs made by the `train` flow (in-process, under the session's Prefect harness), validated on ``bandit`` and
``bandit_test`` (an env name holding a split word of Hugging Face ``datasets``); the first run compacted.

The expected rows are counted here independently of the lake's readers: from the Parquet footers of the files
the lake lists (row counts) and, per (run, iteration, split), with DuckDB over exactly those files."""

from __future__ import annotations

from pathlib import Path

import duckdb

from ragen_core.storage import DataLake
from ragen_core.storage.maintenance import compact_run

GROUPS, GROUP_SIZE, VAL_INSTANCES, ITERATIONS = 2, 4, 3, 2
VAL_ENVS = ["bandit", "bandit_test"]
RUNS = ("tools-a", "tools-b")  # tools-a is compacted


def tiny_config(model_dir: Path) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "env": {"val_envs": VAL_ENVS},
        "rollout": {"env_groups": GROUPS, "group_size": GROUP_SIZE, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": ITERATIONS},
        "eval": {"every": 1, "instances": VAL_INSTANCES},
    }


def make_real_lake(root: Path, model_dir: Path) -> Path:
    """Train both runs into ``root`` and compact the first; returns ``root``."""
    from flows.train import train

    for run_id in RUNS:
        train(tiny_config(model_dir), data_root=str(root), run_id=run_id)
    report = compact_run(DataLake(root), RUNS[0])
    assert report.compacted, "the premise: the first run has compacted partitions"
    return root


def expected_counts(root: Path, table: str) -> dict[tuple[str, int, str], int]:
    """``{(run, iteration, split): rows}`` of a table, by DuckDB over the files the lake lists (no view, no lake
    reader)."""
    files = [str(p) for p in DataLake(root).partition_files(table)]
    rows = duckdb.execute(
        "SELECT run_id, iteration, split, count(*) FROM read_parquet(?, hive_partitioning=false) GROUP BY ALL",
        [files],
    ).fetchall()
    return {(r, i, s): n for r, i, s, n in rows}


def configured_counts() -> dict[tuple[str, int, str], int]:
    """The trajectories each (run, iteration, split) must hold by the config: every train iteration stores
    groups x group size rows, every validation (before the first update and after each) instances per val env."""
    counts = {}
    for run_id in RUNS:
        for iteration in range(ITERATIONS + 1):
            if iteration < ITERATIONS:
                counts[(run_id, iteration, "train")] = GROUPS * GROUP_SIZE
            counts[(run_id, iteration, "val")] = VAL_INSTANCES * len(VAL_ENVS)
    return counts


def counts_of(rows: list[tuple[str, int, str]]) -> dict[tuple[str, int, str], int]:
    """``{(run, iteration, split): n}`` of rows given as (run, iteration, split) tuples."""
    counts: dict[tuple[str, int, str], int] = {}
    for key in rows:
        counts[key] = counts.get(key, 0) + 1
    return counts
