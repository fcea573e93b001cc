import duckdb
import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.storage import BatchMeta, DataLake, LakeError, connect, query, trajectories_table, turns_table


@pytest.fixture()
def records(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2, 3], 4, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)


META = BatchMeta("run-a", 0, "train", 0, 1.0, "hash")


def test_parquet_round_trip_is_token_exact(tmp_path, records):
    lake = DataLake(tmp_path)
    lake.stage_table("run-a", 0, "rollout", "trajectories", trajectories_table(records, META))
    lake.stage_table("run-a", 0, "rollout", "turns", turns_table(records, META))
    assert lake.read_table("trajectories").num_rows == 0  # staged rows are invisible to readers
    published = lake.publish("run-a", 0, "rollout")
    assert {p.parent.name for p in published} == {"iteration=0"}
    rows = lake.read_table("trajectories", "run-a", 0).to_pylist()
    assert [r["input_ids"] for r in rows] == [r.input_ids for r in records]
    assert [r["loss_mask"] for r in rows] == [r.loss_mask for r in records]
    assert all(r["behavior_logprobs"] is None and r["behavior_source"] == "scripted" for r in rows)
    turns = lake.read_table("turns", "run-a", 0).to_pylist()
    assert [t["response"] for t in turns] == [r.turns[0].response for r in records]


def test_redone_stage_overwrites_instead_of_adding(tmp_path, records):
    lake = DataLake(tmp_path)
    for _ in range(2):
        lake.stage_table("run-a", 0, "rollout", "trajectories", trajectories_table(records, META))
        lake.publish("run-a", 0, "rollout")
    assert lake.read_table("trajectories").num_rows == len(records)


def test_duckdb_views_span_runs_and_empty_tables_have_columns(tmp_path, records):
    lake = DataLake(tmp_path)
    assert query(tmp_path, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 0}]
    for run in ("run-a", "run-b"):
        meta = BatchMeta(run, 0, "train", 0, 1.0, "hash")
        lake.stage_table(run, 0, "rollout", "trajectories", trajectories_table(records, meta))
        lake.publish(run, 0, "rollout")
    result = query(
        tmp_path, "SELECT run_id, count(*) AS n, sum(total_reward) AS r FROM trajectories GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    expected_reward = sum(r.total_reward for r in records)
    assert [(x["run_id"], x["n"]) for x in result] == [("run-a", 12), ("run-b", 12)]
    assert result[0]["r"] == pytest.approx(expected_reward)
    con = connect(tmp_path)
    assert "input_ids" in [c[0] for c in con.execute("DESCRIBE trajectories").fetchall()]


def test_schema_mismatch_is_refused(tmp_path):
    with pytest.raises(LakeError, match="does not match its schema"):
        DataLake(tmp_path).stage_table("r", 0, "s", "trajectories", pa.table({"x": [1]}))


def test_truncated_file_gives_a_clear_error_naming_it(tmp_path, records):
    lake = DataLake(tmp_path)
    lake.stage_table("run-a", 0, "rollout", "trajectories", trajectories_table(records, META))
    (path,) = lake.publish("run-a", 0, "rollout")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LakeError, match=str(path.name)):
        lake.read_table("trajectories")
    with pytest.raises(duckdb.Error):
        query(tmp_path, "SELECT count(*) FROM trajectories")


def test_quarantine_moves_the_stage_out_of_staging(tmp_path, records):
    lake = DataLake(tmp_path)
    lake.stage_table("run-a", 0, "rollout", "trajectories", trajectories_table(records, META))
    where = lake.quarantine("run-a", 0, "rollout", '{"ok": false}')
    assert (where / "report.json").is_file() and (where / "trajectories").is_dir()
    assert not lake.stage_dir("run-a", 0, "rollout").exists()
    assert lake.read_table("trajectories").num_rows == 0
