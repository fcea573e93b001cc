"""The run layer's resume decisions on real lakes built by hand (commit markers, checkpoint folders, staged and
published Parquet): what a resume keeps, reuses, loads and replays after a crash at each point of an iteration, what
it refuses, and when a completed run is done or extended. No Prefect, no engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.config import build_config
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta
from ragen_core.run.batches import BatchPipeline, BatchRules
from ragen_core.run.decisions import ResumeError, Start
from ragen_core.run.resume import decide_run_start, metric_history, prepare_extension, prepare_resume
from ragen_core.storage import DataLake, LakeError, Stage
from ragen_core.storage.layout import CHECKPOINT_INFO, checkpoint_file, compaction_marker
from schemas.manifest import RunManifest

RUN, GROUP_SIZE = "crash", 2
FIVE = build_config({}, ["trainer.iterations=5"])
THREE = build_config({}, ["trainer.iterations=3"])


@pytest.fixture(scope="module")
def records(tiny_policy):
    """Two groups of two scripted bandit rollouts (no model sampling: the rows only need to pass the contracts)."""
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], GROUP_SIZE, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=0)


def _pipeline(lake: DataLake, iteration: int, stage: str = Stage.ROLLOUT) -> BatchPipeline:
    meta = BatchMeta.training(RUN, iteration, 1.0, "hash")
    return BatchPipeline(lake, meta, stage, BatchRules(GROUP_SIZE, (-1.0, 1.0)))


def _commit(lake: DataLake, iterations: range, skipped: tuple[int, ...] = ()) -> None:
    for i in iterations:
        lake.commit_iteration(RUN, i, {"skipped": True} if i in skipped else {"updated": True})


def _checkpoint(lake: DataLake, updates: int, complete: bool = True) -> Path:
    folder = lake.checkpoint_dir(RUN, updates)
    folder.mkdir(parents=True)
    if complete:
        checkpoint_file(folder, CHECKPOINT_INFO).write_text("{}")
    return folder


def test_the_plan_loads_the_newest_complete_covered_checkpoint_and_replays_the_updates_after_it(tmp_path):
    lake = DataLake(tmp_path)
    _commit(lake, range(4), skipped=(2,))  # iterations 0-3 committed, 2 skipped (its batch stays quarantined)
    one, _ = _checkpoint(lake, 1), _checkpoint(lake, 3, complete=False)  # 3: killed while it was being written
    _checkpoint(lake, 5)  # from an attempt that got further than the commits (none may be newer than 4 updates)
    plan = prepare_resume(lake, FIVE, RUN, skip_iteration=False)
    # by hand: 4 committed -> next 4; covered complete checkpoints: 1 -> load it; replay 1, 3 (2 was skipped)
    assert (plan.next_iteration, plan.checkpoint, plan.checkpoint_updates) == (4, one, 1)
    assert (plan.replay, plan.skipped, plan.reused_stages, plan.quarantined) == ([1, 3], [2], [], None)


@pytest.mark.parametrize("crash", ["staged", "published", "done", "second_stage_staged"])
def test_a_crash_at_each_point_of_an_iteration_is_discarded_or_reused(tmp_path, records, crash):
    """Iteration 1 of a run with iteration 0 committed stops after its rollout batch was staged, published, or
    published and marked done (then, too, an evaluation batch staged beside it): only a stage marked done is
    reused, with its published rows; everything else of the iteration is gone."""
    lake = DataLake(tmp_path)
    _pipeline(lake, 0).run(records)
    _commit(lake, range(1))
    rollout = _pipeline(lake, 1)
    rollout.persist(records)
    rollout.validate()
    rollout.write()
    if crash != "staged":
        lake.publish(RUN, 1, Stage.ROLLOUT)
    if crash in ("done", "second_stage_staged"):
        lake.mark_stage_done(RUN, 1, Stage.ROLLOUT, {"metrics": {"rows": 4.0}})
    if crash == "second_stage_staged":
        _pipeline(lake, 1, Stage.evaluation("bandit")).persist(records)
    plan = prepare_resume(lake, THREE, RUN, skip_iteration=False)
    reused = crash in ("done", "second_stage_staged")
    assert (plan.next_iteration, plan.reused_stages) == (1, [Stage.ROLLOUT] if reused else [])
    assert lake.read_table("trajectories", RUN, 1).num_rows == (4 if reused else 0)
    assert lake.read_table("trajectories", RUN, 0).num_rows == 4  # the committed iteration is never touched
    assert not lake.stage_dir(RUN, 1, Stage.evaluation("bandit")).exists()
    if reused:
        assert lake.stage_result(RUN, 1, Stage.ROLLOUT) == {"metrics": {"rows": 4.0}}
    else:
        assert lake.finished_stages(RUN, 1) == [] and not lake.stage_dir(RUN, 1, Stage.ROLLOUT).exists()


def test_iterations_after_the_next_one_are_discarded_even_when_marked_done(tmp_path, records):
    lake = DataLake(tmp_path)
    _commit(lake, range(1))
    for iteration in (1, 2):  # 2 cannot have run before 1 was committed: a lake edited by hand, cleared
        _pipeline(lake, iteration).run(records)
    plan = prepare_resume(lake, THREE, RUN, skip_iteration=False)
    assert plan.reused_stages == [Stage.ROLLOUT]
    assert lake.read_table("trajectories", RUN, 2).num_rows == 0 and lake.finished_stages(RUN, 2) == []


def test_a_quarantined_batch_is_refused_unless_skipped(tmp_path):
    lake = DataLake(tmp_path)
    _commit(lake, range(2))
    where = lake.quarantine(RUN, 2, Stage.ROLLOUT, '{"ok": false}')
    with pytest.raises(ResumeError, match=r"iteration 2 of run 'crash' was quarantined .*--skip-iteration"):
        prepare_resume(lake, THREE, RUN, skip_iteration=False)
    plan = prepare_resume(lake, THREE, RUN, skip_iteration=True)
    assert (plan.next_iteration, plan.quarantined) == (2, str(where))


def test_a_gap_in_the_commits_and_a_commit_after_the_next_iteration_are_refused(tmp_path):
    lake = DataLake(tmp_path)
    lake.commit_iteration(RUN, 0, {})
    lake.commit_iteration(RUN, 2, {})
    with pytest.raises(ResumeError, match=r"gaps in its committed iterations \[0, 2\]"):
        prepare_resume(lake, THREE, RUN, skip_iteration=False)
    with pytest.raises(LakeError, match="refusing to discard committed iterations >= 1"):
        lake.discard_uncommitted(RUN, 1)


def _manifest(config, model_dir: str | None = "/m") -> RunManifest:
    return RunManifest(run_id=RUN, config=config.to_dict(), config_hash=config.config_hash(), model_dir=model_dir)


def test_the_start_is_decided_from_what_the_lake_holds(tmp_path):
    lake = DataLake(tmp_path)
    start = str(lake.models_dir() / "m")  # the model the run started from, inside the data root
    assert decide_run_start(lake, None, THREE, RUN, []) is Start.FRESH
    assert decide_run_start(lake, _manifest(THREE, None), THREE, RUN, []) is Start.OVER
    _commit(lake, range(3))
    assert decide_run_start(lake, _manifest(THREE, start), THREE, RUN, []) is Start.RESUME  # no final validation yet
    lake.commit_iteration(RUN, 3, {"updated": False})
    assert decide_run_start(lake, _manifest(THREE, start), THREE, RUN, []) is Start.DONE
    assert decide_run_start(lake, _manifest(THREE, start), FIVE, RUN, ["trainer.iterations"]) is Start.EXTEND
    compaction_marker(lake.partition_dir("metrics", RUN, 3)).parent.mkdir(parents=True)
    compaction_marker(lake.partition_dir("metrics", RUN, 3)).write_text("{}")  # `ragen runs compact` ran on it
    with pytest.raises(ResumeError, match=r"cannot be extended: its final iteration 3 was compacted .*tables metrics"):
        decide_run_start(lake, _manifest(THREE, start), FIVE, RUN, ["trainer.iterations"])
    assert decide_run_start(lake, _manifest(THREE, start), THREE, RUN, []) is Start.DONE  # done needs no reopening


def test_a_resume_from_a_start_model_outside_the_data_root_is_refused_unless_it_is_the_configs(tmp_path):
    """The manifest's model_dir is read by a resume only inside the data root, in a trusted folder, or as the config's
    own model.path (issue 39 item 1); a done run reads no model, so it is not asked."""
    lake = DataLake(tmp_path / "root")
    _commit(lake, range(3))
    with pytest.raises(ResumeError, match=r"^runs/crash/manifest\.json names the start model '/m', outside the data "):
        decide_run_start(lake, _manifest(THREE, "/m"), THREE, RUN, [])
    from_m = build_config(THREE.to_dict(), ["model.path=/m"])
    assert decide_run_start(lake, _manifest(from_m, "/m"), from_m, RUN, []) is Start.RESUME
    lake.commit_iteration(RUN, 3, {"updated": False})
    assert decide_run_start(lake, _manifest(THREE, "/m"), THREE, RUN, []) is Start.DONE
    with pytest.raises(ResumeError, match="names the start model '/m'"):
        decide_run_start(lake, _manifest(THREE, "/m"), FIVE, RUN, ["trainer.iterations"])


def test_an_extension_resumes_at_the_final_validation_and_reuses_its_evaluations(tmp_path, records):
    lake = DataLake(tmp_path)
    _commit(lake, range(3), skipped=(1,))
    _pipeline(lake, 3, Stage.evaluation("bandit")).run(records)  # the final validation's rows, then its commit
    lake.commit_iteration(RUN, 3, {"updated": False})
    two = _checkpoint(lake, 2)
    plan = prepare_extension(lake, _manifest(THREE), FIVE, RUN)
    # by hand: 3 trained (1 skipped) -> next 3; checkpoint 2 covers 0-1, replay 2; the bandit validation reused
    assert (plan.next_iteration, plan.checkpoint, plan.replay) == (3, two, [2])
    assert (plan.skipped, plan.reused_stages) == ([1], [Stage.evaluation("bandit")])
    assert lake.committed_iterations(RUN) == [0, 1, 2, 3]  # preparing reads only


def test_the_metric_history_is_the_stored_metrics_of_the_trained_iterations_in_order(tmp_path):
    lake = DataLake(tmp_path)
    values = {0: {"a": 1.0, "b": 2.0}, 1: {"a": 3.0}, 2: {"a": 5.0}}
    for iteration, metrics in values.items():
        rows = [{"run_id": RUN, "iteration": iteration, "name": k, "value": v} for k, v in metrics.items()]
        lake.write_rows("metrics", RUN, iteration, rows, stage=Stage.COMMIT)
    assert metric_history(lake, RUN, [0, 2]) == [{"a": 1.0, "b": 2.0}, {"a": 5.0}]
    assert metric_history(lake, RUN, []) == []
