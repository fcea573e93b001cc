"""commit_iteration publishes the metrics and evaluations rows and the commit marker, over the real lake."""

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.config import build_config
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta
from ragen_core.run.batches import BatchPipeline, BatchRules
from ragen_core.run.iteration import IterationState
from ragen_core.run.record import RunRecord
from ragen_core.run.session import RunSession
from ragen_core.run.stages import commit_iteration
from ragen_core.storage import DataLake, query
from schemas.manifest import RunManifest


def test_commit_writes_metrics_evaluations_marker_and_manifest(tmp_path, tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2, 3], 2, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)
    lake = DataLake(tmp_path)
    meta = BatchMeta(run_id="run-c", iteration=2, split="val", policy_version=2, temperature=0.5, config_hash="hash")
    assert meta == BatchMeta.validation("run-c", 2, 0.5, "hash")
    BatchPipeline(lake, meta, "eval-bandit", BatchRules(2, (-1.0, 1.0))).run(records)
    config = build_config()
    record = RunRecord(lake, "run-c", RunManifest(run_id="run-c", status="running"))
    session = RunSession(config, lake, "run-c", None, None, record)  # a commit needs no policy and no updater

    result = commit_iteration(session, 2, IterationState({"val/bandit/success": 0.5, "time/evaluate": 1.25}))

    assert result == {"iteration": 2, "metrics": 2, "evaluations": 1, "events": 0, "updated": False}  # no update ran
    metrics = query(tmp_path, "SELECT name, value FROM metrics ORDER BY name").to_pylist()
    assert metrics == [{"name": "time/evaluate", "value": 1.25}, {"name": "val/bandit/success", "value": 0.5}]
    (evaluation,) = query(tmp_path, "SELECT * FROM evaluations").to_pylist()
    successes = [r.success for r in records]
    assert (evaluation["run_id"], evaluation["iteration"], evaluation["env"]) == ("run-c", 2, "bandit")
    assert (evaluation["instances"], evaluation["k"], evaluation["temperature"]) == (3, 2, 0.5)
    assert evaluation["success_rate"] == pytest.approx(sum(successes) / 6)
    assert evaluation["pass_at_k"] == pytest.approx(sum(successes[i] or successes[i + 1] for i in (0, 2, 4)) / 3)
    assert lake.committed_iterations("run-c") == [2]
    assert not (tmp_path / "_staging" / "run-c" / "2").exists()
    (run,) = lake.read_table("runs").to_pylist()
    assert run["iterations_done"] == 1 and run["last_committed_iteration"] == 2
