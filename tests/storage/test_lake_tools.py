"""The lake reads with the usual tools (issue 30, item 2): on a real lake (two tiny runs, one compacted, validated
on an env whose name holds a split word), the one-liners of docs/lake.md ("Reading the lake with other tools")
give every row once, with the files' own ``run_id`` and ``iteration`` columns, and nothing else."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from ragen_core.storage import DataLake, query
from schemas.tables import TABLES
from tests.storage.real_lake import RUNS, configured_counts, counts_of, expected_counts, make_real_lake

KEYS = ["run_id", "iteration", "split"]
SPLIT_WORD = re.compile(
    r"(^|[-._ 0-9])(train|training|validation|valid|dev|val|test|testing|eval|evaluation)"
    r"($|[-._ 0-9])"
)  # datasets' split words, between its separators


@pytest.fixture(scope="module")
def lake_root(prefect_harness, tmp_path_factory, tiny_model_dir) -> Path:
    return make_real_lake(tmp_path_factory.mktemp("tools"), tiny_model_dir)


def _keyed(frame: pd.DataFrame) -> dict[tuple[str, int, str], int]:
    return counts_of([(r, int(i), s) for r, i, s in frame[KEYS].itertuples(index=False)])


def test_the_expected_rows_are_the_configured_ones(lake_root):
    # the premise of every comparison below, from the config alone: 2 runs x (2 train + 3 val iterations)
    assert expected_counts(lake_root, "trajectories") == configured_counts()
    assert query(lake_root, "SELECT count(*) AS n FROM trajectories").column("n")[0].as_py() == sum(
        configured_counts().values()
    )


def test_the_folders_hold_only_parquet_files_named_without_split_words(lake_root):
    table_dir = lake_root / "trajectories"
    visible = [p for p in table_dir.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts)]
    assert visible and all(p.suffix == ".parquet" for p in visible)
    for path in visible:
        relative = path.relative_to(table_dir)
        assert "=" not in str(relative), relative  # no key=value folder: no tool infers a partition column
        assert not any(SPLIT_WORD.search(part) for part in relative.parts), relative
    assert any((p / ".compaction.json").is_file() for p in (table_dir / f"run-{RUNS[0]}").iterdir())  # the premise


@pytest.mark.parametrize("table", ["trajectories", "turns"])
def test_pandas_reads_every_row_once(lake_root, table):
    frame = pd.read_parquet(lake_root / table)
    assert list(frame.columns) == TABLES[table].column_names  # no partition column added, none lost
    if table == "trajectories":
        assert _keyed(frame) == expected_counts(lake_root, table)
    else:
        assert len(frame) == sum(expected_counts(lake_root, table).values())
    assert frame["run_id"].map(type).eq(str).all()  # the file's own column, not a category of folder names


def test_pyarrow_dataset_and_read_table_read_every_row_once(lake_root):
    table_dir = lake_root / "trajectories"
    dataset = ds.dataset(table_dir)
    assert dataset.schema.names == TABLES["trajectories"].column_names
    read = pq.read_table(table_dir)
    assert read.schema.field("run_id").type == dataset.schema.field("run_id").type == "string"
    expected = expected_counts(lake_root, "trajectories")
    for table in (dataset.to_table(columns=KEYS), read.select(KEYS)):
        assert counts_of(list(zip(*(table[k].to_pylist() for k in KEYS), strict=True))) == expected
    one_run = dataset.to_table(filter=ds.field("run_id") == RUNS[1], columns=["iteration"])
    assert one_run.num_rows == sum(n for (run, _, _), n in expected.items() if run == RUNS[1])


def test_polars_reads_every_row_once(lake_root):
    pattern = f"{lake_root / 'trajectories'}/**/*.parquet"
    frame = pl.read_parquet(pattern)
    assert frame.columns == TABLES["trajectories"].column_names
    assert counts_of(frame.select(KEYS).rows()) == expected_counts(lake_root, "trajectories")
    lazy = pl.scan_parquet(pattern).filter(pl.col("split") == "val").group_by("run_id").len().collect()
    expected = expected_counts(lake_root, "trajectories")
    assert dict(lazy.rows()) == {
        run: sum(n for (r, _, s), n in expected.items() if r == run and s == "val") for run in RUNS
    }


def test_datasets_loads_every_row_as_one_split(lake_root, tmp_path):
    datasets = pytest.importorskip("datasets")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    table_dir = lake_root / "trajectories"
    loaded = datasets.load_dataset("parquet", data_dir=str(table_dir), cache_dir=str(tmp_path / "hf"))
    assert list(loaded) == ["train"]  # no file taken for a split by its name: every row in the one split
    rows = loaded["train"].select_columns(KEYS)
    assert counts_of([(r["run_id"], r["iteration"], r["split"]) for r in rows]) == expected_counts(
        lake_root, "trajectories"
    )
    files = datasets.load_dataset(
        "parquet", data_files=f"{table_dir}/**/*.parquet", split="train", cache_dir=str(tmp_path / "hf")
    )
    assert files.num_rows == sum(expected_counts(lake_root, "trajectories").values())
    assert files.filter(lambda r: r["split"] == "val").num_rows == sum(
        n for (_, _, s), n in expected_counts(lake_root, "trajectories").items() if s == "val"
    )


def test_duckdb_reads_the_folders_by_glob(lake_root):
    import duckdb

    pattern = f"{lake_root / 'trajectories'}/**/*.parquet"
    rows = duckdb.execute("SELECT run_id, iteration, split FROM read_parquet(?)", [pattern]).fetchall()
    assert counts_of(rows) == expected_counts(lake_root, "trajectories")
    assert DataLake(lake_root).read_table("trajectories").num_rows == len(rows)
