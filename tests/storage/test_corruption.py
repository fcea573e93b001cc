"""Damaged files give a clear error naming the file, through the lake reader and through DuckDB."""

import re

import duckdb
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, trajectories_table
from ragen_core.storage import DataLake, LakeError, connect, query
from ragen_core.storage.catalog import _read_failure
from schemas.manifest import RunManifest


@pytest.fixture()
def lake(tmp_path, tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], 4, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    lake = DataLake(tmp_path)
    for iteration in (0, 1):
        meta = BatchMeta(
            run_id="run-a",
            iteration=iteration,
            split="train",
            policy_version=iteration,
            temperature=1.0,
            config_hash="hash",
        )
        lake.stage_table("run-a", iteration, "rollout", "trajectories", trajectories_table(records, meta))
        lake.publish("run-a", iteration, "rollout")
        rows = [{"run_id": "run-a", "iteration": iteration, "name": "m", "value": 1.0}]
        lake.write_rows("metrics", "run-a", iteration, rows, stage="commit")
    return lake


def _truncate(lake: DataLake, iteration: int = 1):
    (path,) = lake.partition_files("trajectories", "run-a", iteration)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_truncated_file_via_the_lake_reader(lake):
    path = _truncate(lake)
    with pytest.raises(LakeError, match=f"cannot read Parquet file '{re.escape(str(path))}'.*damaged or truncated"):
        lake.read_table("trajectories")
    assert lake.read_table("trajectories", "run-a", 0).num_rows == 8  # the intact partition still reads


def test_truncated_file_via_duckdb_names_the_file_and_spares_other_tables(lake):
    path = _truncate(lake)
    expected = rf"cannot read table 'trajectories': damaged Parquet file\(s\) '{re.escape(str(path))}'"
    with pytest.raises(LakeError, match=expected):
        query(lake.root, "SELECT count(*) FROM trajectories")
    assert query(lake.root, "SELECT count(*) AS n FROM metrics").to_pylist() == [{"n": 2}]
    con = connect(lake.root)  # a plain connection: DuckDB's own error, still naming the file
    with pytest.raises(duckdb.Error, match=re.escape(str(path))):
        con.execute("SELECT sum(total_reward) FROM trajectories").fetchall()
    with pytest.raises(duckdb.Error, match=re.escape(str(path))):  # fails when bound: even DESCRIBE
        con.execute("DESCRIBE trajectories").fetchall()
    assert ("trajectories",) in con.execute("SHOW TABLES").fetchall()  # the table is still listed


def test_corrupted_pages_via_the_reader_and_duckdb(lake):
    (path,) = lake.partition_files("trajectories", "run-a", 1)
    data = bytearray(path.read_bytes())
    data[4 : len(data) // 2] = b"\xab" * (len(data) // 2 - 4)  # footer intact, data pages garbage
    path.write_bytes(bytes(data))
    with pytest.raises(LakeError, match=re.escape(str(path))):
        lake.read_table("trajectories")
    with pytest.raises(LakeError, match=re.escape(str(path))):
        query(lake.root, "SELECT sum(list_sum(input_ids)) FROM trajectories")


def test_a_duckdb_message_without_the_path_gets_the_damaged_file_added(lake):
    path = _truncate(lake)
    error = _read_failure(
        duckdb.IOException("IO Error: unexpected end of stream"), "trajectories", lake.partition_files("trajectories")
    )
    assert str(path) in str(error) and "unexpected end of stream" in str(error)


def test_sql_mistakes_stay_duckdb_errors(lake):
    with pytest.raises(duckdb.Error, match="nonexistent"):
        query(lake.root, "SELECT nonexistent FROM trajectories")


def test_damaged_manifest_names_the_file(lake):
    lake.write_manifest("run-a", RunManifest(run_id="run-a", status="running", updated_at="2025-01-01T00:00:00"))
    path = lake.run_dir("run-a") / "manifest.json"
    path.write_text(path.read_text()[:20])
    with pytest.raises(LakeError, match=f"cannot read JSON file '{re.escape(str(path))}'"):
        lake.read_table("runs")
    with pytest.raises(LakeError, match="manifest.json"):
        query(lake.root, "SELECT * FROM runs")
    assert query(lake.root, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 16}]
