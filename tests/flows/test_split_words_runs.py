"""Every kind of run the README makes (train, eval, retrain, sweep; then export) lands in a data root from whose
table folders Hugging Face ``datasets`` loads every row in its one split (issue 40, section 4 item 2: an
``eval-...`` run folder once made ``load_dataset("parquet", data_dir=...)`` return only that run's rows). Each run
takes its default id, as the README's commands do; the training env's name holds a split word (``bandit_test``)."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from ragen_core.storage import DataLake
from ragen_core.storage.maintenance.export import export_dataset
from ragen_core.storage.names import split_word_in

datasets = pytest.importorskip("datasets")
KEYS = ("run_id", "iteration", "split")


def _config(model_dir: Path, env: str) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "env": {"name": env, "val_envs": ["bandit", "bandit_test"]},
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 1},
        "eval": {"every": 1, "instances": 2},
    }


@pytest.fixture(scope="module")
def every_kind(prefect_harness, tmp_path_factory, tiny_model_dir) -> tuple[Path, dict[str, str]]:
    from flows.evaluate import evaluate
    from flows.retrain import retrain_offline
    from flows.sweep import sweep
    from flows.train import train

    root = tmp_path_factory.mktemp("kinds")
    trained = train(_config(tiny_model_dir, "bandit_test"), data_root=str(root))["run_id"]
    evaluated = evaluate(trained, n=2, data_root=str(root))["run_id"]
    sql = f"SELECT * FROM trajectories WHERE run_id = '{trained}' AND split = 'train'"
    retrained = retrain_offline(_config(tiny_model_dir, "bandit"), sql, f"run:{trained}", "sft", str(root))["run_id"]
    swept = sweep(_config(tiny_model_dir, "bandit"), grid=["algorithm.filter_ratio=[0.5,1.0]"], data_root=str(root))
    kinds = {"train": trained, "eval": evaluated, "retrain": retrained}
    kinds.update({f"sweep {p['run_id']}": p["run_id"] for p in swept["points"]})
    return root, kinds


def _counts(rows) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for row in rows:
        key = tuple(row[k] for k in KEYS)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _expected(root: Path, table: str) -> dict[tuple, int]:
    """``{(run, iteration, split): rows}`` by DuckDB over the files the lake lists (no lake reader)."""
    files = [str(p) for p in DataLake(root).partition_files(table)]
    rows = duckdb.execute(
        "SELECT run_id, iteration, split, count(*) FROM read_parquet(?, hive_partitioning=false) GROUP BY ALL", [files]
    ).fetchall()
    return {(r, i, s): n for r, i, s, n in rows}


def test_no_run_id_holds_a_split_word(every_kind):
    root, kinds = every_kind
    assert {name: split_word_in(run_id) for name, run_id in kinds.items()} == dict.fromkeys(kinds)
    assert kinds["eval"].startswith("evaluate-") and kinds["train"].startswith("bandit_tst-")
    for table in ("trajectories", "turns", "metrics"):  # every name under the table folders, not only the runs'
        names = {part for path in (root / table).rglob("*") for part in path.relative_to(root / table).parts}
        assert names and [name for name in names if split_word_in(name)] == []


@pytest.mark.parametrize("table", ["trajectories", "turns"])
def test_datasets_loads_every_row_of_every_kind_of_run(every_kind, table, tmp_path):
    root, kinds = every_kind
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    expected = _expected(root, table)
    assert {key[0] for key in expected} == set(kinds.values())  # the premise: every run has rows in the table
    loaded = datasets.load_dataset("parquet", data_dir=str(root / table), cache_dir=str(tmp_path / "hf"))
    assert list(loaded) == ["train"]
    assert _counts(loaded["train"].select_columns(list(KEYS))) == expected


def test_the_export_of_every_run_loads_as_train_and_validation(every_kind, tmp_path):
    root, kinds = every_kind
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    export_dataset(DataLake(root), tmp_path / "ds", sorted(set(kinds.values())), ["trajectories"])
    loaded = datasets.load_dataset("parquet", data_dir=str(tmp_path / "ds"), cache_dir=str(tmp_path / "hf"))
    expected = _expected(root, "trajectories")
    assert sorted(loaded) == ["train", "validation"]
    for name, split in (("train", "train"), ("validation", "val")):
        assert _counts(loaded[name].select_columns(list(KEYS))) == {k: n for k, n in expected.items() if k[2] == split}
