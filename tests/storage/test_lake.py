import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from ragen_core.storage import DataLake, LakeError, checkpoint_row, connect, evaluation_rows, event_row, query
from ragen_core.storage.layout import published_part_name
from schemas import TABLES
from schemas.manifest import RunManifest


@pytest.fixture()
def records(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2, 3], 4, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)


META = BatchMeta(run_id="run-a", iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="hash")


def test_parquet_round_trip_is_token_exact(tmp_path, records):
    lake = DataLake(tmp_path)
    lake.stage_table("run-a", 0, "rollout", "trajectories", trajectories_table(records, META))
    lake.stage_table("run-a", 0, "rollout", "turns", turns_table(records, META))
    assert lake.read_table("trajectories").num_rows == 0  # staged rows are invisible to readers
    published = lake.publish("run-a", 0, "rollout")
    assert {p.parent for p in published} == {
        lake.partition_dir("trajectories", "run-a", 0),
        lake.partition_dir("turns", "run-a", 0),
    }
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
        meta = BatchMeta(run_id=run, iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="hash")
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


def test_quarantine_moves_the_stage_out_of_staging(tmp_path, records):
    lake = DataLake(tmp_path)
    lake.stage_table("run-a", 0, "rollout", "trajectories", trajectories_table(records, META))
    where = lake.quarantine("run-a", 0, "rollout", '{"ok": false}')
    assert (where / "report.json").is_file() and (where / "trajectories").is_dir()
    assert not lake.stage_dir("run-a", 0, "rollout").exists()
    assert lake.read_table("trajectories").num_rows == 0


def _metric_rows(run_id: str, iteration: int, values: dict[str, float]) -> list[dict]:
    return [{"run_id": run_id, "iteration": iteration, "name": k, "value": v} for k, v in values.items()]


def test_every_table_has_a_view_with_its_columns_on_a_fresh_root(tmp_path):
    con = connect(tmp_path)
    for name, spec in TABLES.items():
        described = con.execute(f"DESCRIBE {name}").fetchall()
        # the stored columns, then those the view computes (the checkpoints' ``available``)
        assert [row[0] for row in described] == [*spec.column_names, *(c.name for c in spec.computed)], name
        assert con.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,)


def test_write_rows_publishes_self_describing_files_under_deterministic_names(tmp_path):
    lake = DataLake(tmp_path)
    path = lake.write_rows("metrics", "run-a", 3, _metric_rows("run-a", 3, {"a": 1.0, "b": 2.0}), stage="commit")
    assert path == lake.partition_dir("metrics", "run-a", 3) / published_part_name("commit", 0) and path.is_file()
    assert path.name == "part-9505cacb7c71-00000.parquet"  # sha256("commit")[:12]: no stage word in the name
    schema = pq.read_schema(path)
    assert schema.metadata[b"schema_version"] == b"1" and schema.metadata[b"table"] == b"metrics"
    assert schema.field("value").metadata[b"description"] == b"Metric value."
    lake.write_rows("metrics", "run-a", 3, _metric_rows("run-a", 3, {"a": 5.0}), stage="commit")  # a redo replaces
    assert query(tmp_path, "SELECT name, value FROM metrics").to_pylist() == [{"name": "a", "value": 5.0}]
    assert not list(lake.stage_dir("run-a", 3, "commit").rglob("*.parquet"))


def test_write_rows_refuses_rows_outside_the_partition_and_quarantines_them(tmp_path):
    lake = DataLake(tmp_path)
    with pytest.raises(LakeError, match=r"failed checks metrics:partition; quarantined"):
        lake.write_rows("metrics", "run-a", 1, _metric_rows("run-a", 2, {"a": 1.0}), stage="commit")
    report = json.loads((lake.quarantine_dir("run-a", 1, "commit") / "report.json").read_text())
    assert report["failed_checks"] == ["metrics:partition"] and report["failures"][0]["rows"] == [{"row": 0}]
    assert lake.read_table("metrics").num_rows == 0 and not lake.table_dir("metrics").exists()
    with pytest.raises(LakeError, match="derived from the run manifests"):
        lake.write_rows("runs", "run-a", 1, [], stage="commit")
    with pytest.raises(LakeError, match="rows do not fit table 'metrics'"):
        lake.write_rows("metrics", "run-a", 1, [{"run_id": "run-a", "iteration": "x"}], stage="commit")


def test_checkpoints_events_and_evaluations_round_trip(tmp_path, records):
    lake = DataLake(tmp_path)
    when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    lake.write_rows(
        "checkpoints", "run-a", 2, [checkpoint_row("run-a", 2, "/ckpt/2", "hf", {"x": 1.5}, when)], stage="ckpt"
    )
    warning = event_row("run-a", 2, "early_warning", "std collapsed", "rollout/in_group_reward_std", 0.01, 0.05, when)
    note = event_row("run-a", 2, "info", "note", created_at=when)
    lake.write_rows("events", "run-a", 2, [warning, note], stage="events")
    (checkpoint,) = lake.read_table("checkpoints").to_pylist()
    assert checkpoint["path"] == "/ckpt/2" and json.loads(checkpoint["metrics_json"]) == {"x": 1.5}
    assert checkpoint["created_at"] == when
    events = query(tmp_path, "SELECT kind, metric, threshold FROM events ORDER BY kind").to_pylist()
    assert events == [
        {"kind": "early_warning", "metric": "rollout/in_group_reward_std", "threshold": 0.05},
        {"kind": "info", "metric": None, "threshold": None},
    ]
    val = trajectories_table(
        records,
        BatchMeta(run_id="run-a", iteration=2, split="val", policy_version=2, temperature=0.5, config_hash="hash"),
    )
    evaluations = evaluation_rows(val).to_pylist()
    successes = [r.success for r in records]  # 3 groups of 4
    assert len(evaluations) == 1 and evaluations[0]["instances"] == 3 and evaluations[0]["k"] == 4
    assert evaluations[0]["success_rate"] == pytest.approx(sum(successes) / 12)
    assert evaluations[0]["pass_at_k"] == pytest.approx(sum(any(successes[g * 4 : g * 4 + 4]) for g in range(3)) / 3)
    assert evaluations[0]["temperature"] == 0.5
    assert evaluation_rows(trajectories_table(records, META)).num_rows == 0  # train rows are not evaluations


def test_runs_table_is_derived_from_the_manifests_and_commits(tmp_path):
    lake = DataLake(tmp_path)
    manifest = {
        "run_id": "run-a",
        "config": {"seed": 7},
        "config_hash": "abc",
        "seed": 7,
        "versions": {"torch": "2"},
        "status": "running",
        "started_at": "2025-01-01T00:00:00+00:00",
        "updated_at": "2025-01-01T00:05:00+00:00",
    }
    lake.write_manifest("run-a", RunManifest(**manifest))
    lake.write_manifest(
        "boot",
        RunManifest(run_id="boot", kind="bootstrap", status="completed", updated_at="2025-01-01T00:00:00+00:00"),
    )
    lake.commit_iteration("run-a", 0, {})
    lake.commit_iteration("run-a", 1, {})
    rows = {r["run_id"]: r for r in lake.read_table("runs").to_pylist()}
    assert rows["run-a"]["iterations_done"] == 2 and rows["run-a"]["last_committed_iteration"] == 1
    assert rows["run-a"]["kind"] == "train" and rows["run-a"]["seed"] == 7 and rows["run-a"]["git_commit"] is None
    assert json.loads(rows["run-a"]["config_json"]) == {"seed": 7}
    assert rows["run-a"]["created_at"] == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert rows["boot"]["kind"] == "bootstrap" and rows["boot"]["iterations_done"] == 0
    lake.write_manifest("run-a", RunManifest(**{**manifest, "status": "completed"}))  # the table follows the manifest
    result = query(tmp_path, "SELECT run_id, status, iterations_done FROM runs ORDER BY run_id").to_pylist()
    assert result == [
        {"run_id": "boot", "status": "completed", "iterations_done": 0},
        {"run_id": "run-a", "status": "completed", "iterations_done": 2},
    ]
