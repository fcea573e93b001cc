"""A data root whose path holds glob characters (issue 66, A): ``data[1]`` beside a sibling ``data1`` that holds a
run of the same id. Every path the lake or a library globs is taken literally: the resume loads its own checkpoint
(DeepSpeed's checkpoint glob used to fail with a long traceback, or load the sibling's weights), and ``ragen sql`` /
``ragen runs`` read the root's own files (DuckDB's read_parquet globs its path arguments: the sibling's files matched
``data[1]``'s, and the locked connection refused to open them).

The expected values are computed here without the lake's readers: the root's Parquet files found by ``os.walk`` and
read with pyarrow."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import ragen_core
from ragen_cli.main import app
from ragen_core.storage import DataLake

RUN = "glob"  # the same id in both roots: the sibling's files lie at the same places under `data1`


def _config(model_dir: Path, seed: int, iterations: int) -> dict:
    return {
        "seed": seed,
        "model": {"path": str(model_dir)},
        "env": {"name": "bandit", "val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 8, "micro_batch_size": 4},
        "trainer": {"iterations": iterations, "checkpoint_every": 1},
        "eval": {"every": 1, "instances": 2},
        "monitor": {"truncated_share": None},
    }


@pytest.fixture(scope="module")
def roots(tmp_path_factory, tiny_model_dir) -> tuple[Path, Path]:
    """``<base>/data[1]`` with a run of 2 iterations, and ``<base>/data1`` with a run of the same id (another seed,
    3 iterations): wherever ``data[1]`` is read as a pattern, it matches the sibling's files."""
    base = tmp_path_factory.mktemp("literal")
    ours, sibling = base / "data[1]", base / "data1"
    assert ragen_core.train(_config(tiny_model_dir, 7, 3), sibling, RUN).status == "completed"
    assert ragen_core.train(_config(tiny_model_dir, 0, 2), ours, RUN).status == "completed"
    return ours, sibling


def _parquet_files(root: Path, table: str) -> list[Path]:
    return sorted(Path(d) / f for d, _, files in os.walk(root / table) for f in files if f.endswith(".parquet"))


def _expected(root: Path) -> dict[str, float]:
    """Row count and reward sum of the root's trajectories, by pyarrow over its own files (no compaction ran, so
    every file is a published part)."""
    table = pa.concat_tables(
        [pq.read_table(p, columns=["total_reward"]) for p in _parquet_files(root, "trajectories")]
    )
    return {"n": table.num_rows, "reward": pc.sum(table["total_reward"]).as_py()}


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_sql_reads_the_roots_own_files_and_nothing_of_its_sibling(roots):
    ours, sibling = roots
    result = _cli(
        "sql", "SELECT count(*) AS n, sum(total_reward) AS reward FROM trajectories", "--data-root", ours, "-f", "json"
    )
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    expected, theirs = _expected(ours), _expected(sibling)
    assert expected != theirs  # the premise: the sibling's rows would show
    assert row["n"] == expected["n"] == 2 * 8 + 3 * 2  # 2 train iterations of 2 x 4, 3 validations of 2
    assert row["reward"] == pytest.approx(expected["reward"])
    scoped = _cli("sql", "SELECT max(iteration) AS i FROM metrics", "--data-root", ours, "--run", RUN, "-f", "json")
    assert scoped.exit_code == 0, scoped.output
    assert json.loads(scoped.stdout) == [{"i": 2}]  # the sibling's run has an iteration 3


def test_sql_reads_a_root_whose_path_holds_a_backslash_too(roots):
    """DuckDB's glob takes a backslash for a folder separator, so no escaped pattern names such a file: its tables
    are read by the lake's Python reader instead, with the same answer."""
    ours, _ = roots
    odd = Path(shutil.copytree(ours, ours.parent / "back\\slash[2]", symlinks=True))
    result = _cli(
        "sql", "SELECT count(*) AS n, sum(total_reward) AS reward FROM trajectories", "--data-root", odd, "-f", "json"
    )
    assert result.exit_code == 0, result.output
    [row], expected = json.loads(result.stdout), _expected(odd)
    assert row["n"] == expected["n"] and row["reward"] == pytest.approx(expected["reward"])


def test_runs_lists_the_roots_own_run(roots):
    ours, _ = roots
    result = _cli("runs", "--data-root", ours, "-f", "json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert row["run_id"] == RUN and row["status"] == "completed"
    assert row["iterations"] == len(DataLake(ours).committed_iterations(RUN)) == 3  # the sibling's: 4
    assert row["val_iteration"] == 2  # its final validation (the sibling's: 3)


@contextmanager
def _reads_under(folder: Path) -> Iterator[list[str]]:
    """The paths under ``folder`` this process opens or lists within the block (Python's audit events: ``open``,
    ``os.scandir``, ``os.listdir``; torch and DeepSpeed read checkpoints through them)."""
    prefix = str(folder) + os.sep
    seen: list[str] = []
    if not _AUDIT["installed"]:  # once, in the worker that runs this file: a hook cannot be removed
        sys.addaudithook(_audit)
        _AUDIT["installed"] = True
    _AUDIT["seen"], _AUDIT["prefix"] = seen, prefix
    try:
        yield seen
    finally:
        _AUDIT["seen"] = None


_AUDIT: dict = {"seen": None, "prefix": "", "installed": False}


def _audit(event: str, args: tuple) -> None:
    seen = _AUDIT["seen"]
    if seen is None or event not in ("open", "os.scandir", "os.listdir") or not args:
        return
    path = args[0]
    if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(_AUDIT["prefix"]):
        seen.append(os.fspath(path))


def test_resume_of_a_copy_without_a_sibling_finds_its_checkpoint(roots):
    """Without a sibling the pattern matched nothing: DeepSpeed found no model state and the resume failed."""
    ours, _ = roots
    lone = Path(shutil.copytree(ours, ours.parent / "lone[9]", symlinks=True))
    resumed = ragen_core.resume(RUN, lone, overrides=["trainer.iterations=3"], force_config=["trainer.iterations"])
    assert resumed.status == "completed" and DataLake(lone).committed_iterations(RUN) == [0, 1, 2, 3]


def test_resume_loads_the_roots_own_checkpoint(roots):
    ours, sibling = roots
    with _reads_under(sibling) as seen:
        extended = ragen_core.resume(
            RUN, ours, overrides=["trainer.iterations=3"], force_config=["trainer.iterations"]
        )
    assert extended.status == "completed"
    assert seen == []  # nothing of the sibling was opened or listed
    assert DataLake(ours).committed_iterations(RUN) == [0, 1, 2, 3]
    assert extended.details["resumed"]["next_iteration"] == 2
