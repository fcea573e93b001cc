"""The rules of the commit and of the stop, on a real lake and a session without a policy or engines (an updater that
only writes the checkpoint folder it is asked for): when a checkpoint is due, the early stop and its record, an
iteration skipped on resume, and a completed run's final validation reopened for an extension."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.config import build_config
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta
from ragen_core.run.batches import BatchPipeline, BatchRules
from ragen_core.run.iteration import IterationState
from ragen_core.run.record import RunRecord
from ragen_core.run.resume import prepare_extension, reopen_final_evaluation, skip_iteration
from ragen_core.run.session import RunSession
from ragen_core.run.stages import commit_iteration, stop_early
from ragen_core.storage import DataLake, Stage
from ragen_core.storage.layout import CHECKPOINT_INFO, checkpoint_file
from schemas.manifest import RunManifest

RUN = "rules"
EMPTY, KEPT = {"filter/kept_groups": 0.0}, {"filter/kept_groups": 2.0}


class FolderUpdater:
    """Writes a complete checkpoint folder per save, as the engines' save does, and nothing else."""

    def __init__(self, lake: DataLake) -> None:
        self.lake, self.saved = lake, []

    def save(self, updates: int, extra: dict[str, Any]) -> Path:
        folder = self.lake.checkpoint_dir(RUN, updates)
        folder.mkdir(parents=True)
        checkpoint_file(folder, CHECKPOINT_INFO).write_text("{}")
        self.saved.append(updates)
        return folder


def _session(tmp_path: Path, *overrides: str) -> RunSession:
    config = build_config({}, ["monitor.tensorboard=false", *overrides])
    lake = DataLake(tmp_path)
    record = RunRecord(lake, RUN, RunManifest(run_id=RUN, status="running", config=config.to_dict(), model_dir="/m"))
    record.update()
    return RunSession(config, lake, RUN, policy=None, updater=FolderUpdater(lake), record=record)


def test_a_checkpoint_is_due_every_checkpoint_every_updates_and_after_the_last(tmp_path):
    session = _session(
        tmp_path,
        "trainer.iterations=5",
        "trainer.checkpoint_every=2",
        "trainer.keep_last=2",
        "algorithm.filter_empty_stop_steps=0",
    )
    payloads = [commit_iteration(session, i, IterationState(dict(KEPT), updated=True)) for i in range(5)]
    # by hand: updates 1..5; due at 2 and 4 (every 2) and 5 (the last); the 2 newest kept
    assert session.updater.saved == [2, 4, 5]
    assert [("checkpoint" in p) for p in payloads] == [False, True, False, True, True]
    assert [n for n, _ in session.lake.list_checkpoints(RUN)] == [4, 5]
    assert payloads[4]["updated"] is True and session.lake.commit_payload(RUN, 4)["updated"] is True
    validation = commit_iteration(session, 5, IterationState({"val/bandit/success": 1.0}))  # the final validation
    assert "checkpoint" not in validation and validation["updated"] is False and session.updater.saved == [2, 4, 5]
    assert session.lake.committed_iterations(RUN) == [0, 1, 2, 3, 4, 5]
    assert session.lake.read_manifest(RUN).last_committed_iteration == 5
    assert len(session.record.metric_history) == 6


def test_the_last_update_before_an_early_stop_is_checkpointed_and_the_stop_recorded(tmp_path):
    session = _session(
        tmp_path, "trainer.iterations=10", "trainer.checkpoint_every=5", "algorithm.filter_empty_stop_steps=2"
    )
    kept = [KEPT, EMPTY, KEPT, EMPTY, EMPTY]
    stops = []
    for iteration, metrics in enumerate(kept):
        stops.append(stop_early(session, iteration))
        commit_iteration(session, iteration, IterationState(dict(metrics), updated=True))
    # by hand: the streak of empty iterations reaches 2 after iteration 4, so iteration 4 is the last update (5
    # updates, also due by checkpoint_every) and the run stops before iteration 5; never before
    assert stops == [False] * 5 and stop_early(session, 5)
    assert session.updater.saved == [5]
    assert session.lake.read_manifest(RUN).early_stop == {
        "iteration": 5,
        "reason": "filter_empty_stop_steps",
        "steps": 2,
    }


def test_an_early_stop_off_schedule_still_checkpoints_its_last_update(tmp_path):
    session = _session(
        tmp_path, "trainer.iterations=10", "trainer.checkpoint_every=4", "algorithm.filter_empty_stop_steps=2"
    )
    for iteration, metrics in enumerate([KEPT, EMPTY, EMPTY]):
        commit_iteration(session, iteration, IterationState(dict(metrics), updated=True))
    assert session.updater.saved == [3]  # 3 updates: not a multiple of 4, but the last before the stop
    assert session.lake.read_manifest(RUN).early_stop is None  # recorded when the next iteration is refused


def test_a_skipped_iteration_is_committed_with_its_quarantine_and_an_event(tmp_path):
    session = _session(tmp_path, "trainer.iterations=3")
    commit_iteration(session, 0, IterationState(dict(KEPT), updated=True))
    skip_iteration(session, 1, "/q/1")
    assert session.lake.commit_payload(RUN, 1) == {"skipped": True, "quarantine": "/q/1"}
    events = session.lake.read_table("events", RUN, 1).to_pylist()
    assert [(e["kind"], e["message"]) for e in events] == [
        ("skipped_iteration", "iteration 1 skipped on resume; its batch stays quarantined in /q/1")
    ]
    assert session.lake.read_manifest(RUN).last_committed_iteration == 1


@pytest.fixture(scope="module")
def records(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [7], 2, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=2)


def test_an_extension_reopens_the_final_validation_keeping_its_rows_as_a_finished_stage(tmp_path, records):
    session = _session(tmp_path, "trainer.iterations=2", "trainer.checkpoint_every=1")
    lake = session.lake
    for iteration in range(2):
        commit_iteration(session, iteration, IterationState({**KEPT, "actor/loss": float(iteration)}, updated=True))
    meta = BatchMeta.validation(RUN, 2, 1.0, "hash")
    BatchPipeline(lake, meta, Stage.evaluation("bandit"), BatchRules(2, (-1.0, 1.0))).run(records)
    final = {"val/bandit/success": 0.5, "val/bandit/reward_mean": 0.25, "time/evaluate": 3.0}
    commit_iteration(session, 2, IterationState(final))
    assert lake.read_table("evaluations", RUN, 2).num_rows == 1

    longer = build_config({}, ["monitor.tensorboard=false", "trainer.iterations=4", "trainer.checkpoint_every=1"])
    plan = prepare_extension(lake, session.record.manifest, longer, RUN)
    assert (plan.next_iteration, plan.checkpoint_updates, plan.replay) == (2, 2, [])
    session.record.manifest = session.record.manifest.updated(resumes=[{}])  # the attempt a resume appends
    reused = reopen_final_evaluation(session, plan, lake.read_manifest(RUN))
    assert reused == [Stage.evaluation("bandit")]
    assert lake.committed_iterations(RUN) == [0, 1]
    # the validation's metrics go back to its finished stage (only its own env's), its commit rows are gone
    expected = {"val/bandit/success": 0.5, "val/bandit/reward_mean": 0.25}
    assert lake.stage_result(RUN, 2, Stage.evaluation("bandit")) == {"metrics": expected}
    for table in ("metrics", "evaluations"):
        assert lake.read_table(table, RUN, 2).num_rows == 0
    assert lake.read_table("trajectories", RUN, 2).num_rows == 2  # the rollouts stay, to be reused
    manifest = lake.read_manifest(RUN)
    assert manifest.last_committed_iteration == 1
    assert manifest.resumes[-1] == {"extended_from": 2, "reused_stages": [Stage.evaluation("bandit")]}


def _every_row(lake: DataLake) -> dict[str, list[str]]:
    """Every published row of the run, by table, every column, sorted."""
    tables = sorted(name for name, spec in lake.tables.items() if spec.source == "parquet")
    return {t: sorted(repr(sorted(r.items())) for r in lake.read_table(t, RUN).to_pylist()) for t in tables}


def _reopened_run(tmp_path: Path, records: Any) -> tuple[RunSession, RunManifest, tuple[dict, dict]]:
    """A completed 2-iteration run (its final validation committed as iteration 2), extended to 4: its session opened
    with the longer config and its final validation reopened. Returns the session, the run's manifest, and its rows
    and final commit payload, before the extension."""
    session = _session(tmp_path, "trainer.iterations=2", "trainer.checkpoint_every=1")
    lake = session.lake
    for iteration in range(2):
        commit_iteration(session, iteration, IterationState({**KEPT, "actor/loss": float(iteration)}, updated=True))
    meta = BatchMeta.validation(RUN, 2, 1.0, "hash")
    BatchPipeline(lake, meta, Stage.evaluation("bandit"), BatchRules(2, (-1.0, 1.0))).run(records)
    commit_iteration(session, 2, IterationState({"val/bandit/success": 0.5, "time/evaluate": 3.0}))
    session.record.update(status="completed")
    stored, before = lake.read_manifest(RUN), (_every_row(lake), lake.commit_payload(RUN, 2))
    longer = build_config({}, ["monitor.tensorboard=false", "trainer.iterations=4", "trainer.checkpoint_every=1"])
    plan = prepare_extension(lake, stored, longer, RUN)
    session.record.update(status="running", config=longer.to_dict(), resumes=[{}])  # what the session opened with
    reopen_final_evaluation(session, plan, stored)
    return session, stored, before


def test_an_extension_that_fails_before_its_first_commit_is_undone_and_the_run_stays_completed(tmp_path, records):
    """Issue 66, item 6: the extension's iteration 2 published a batch and completed a checkpoint (3 updates), then a
    write found no space before its commit. The run is put back: the final validation committed again with its very
    rows and payload, the extension's batch and checkpoint gone, the stored manifest back; the error says so."""
    import errno

    from ragen_core.run.decisions import ExtensionUndone
    from ragen_core.storage import event_row
    from ragen_core.storage.maintenance.space import SPACE_PREFIX

    session, stored, (rows, payload) = _reopened_run(tmp_path, records)
    lake = session.lake
    row = event_row(RUN, 2, "extension", "a row the extension's batch published")
    lake.write_rows("events", RUN, 2, [row], stage=Stage.ROLLOUT)
    session.updater.save(3, {})  # the checkpoint after the extension's update, complete
    assert lake.committed_iterations(RUN) == [0, 1] and _every_row(lake) != rows

    undone = session.record.stopped(OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(undone, ExtensionUndone)
    message = str(undone)
    assert message.startswith(f"{SPACE_PREFIX} while writing ") and "\n" not in message
    assert message.endswith(
        f". The extension was undone: run {RUN} is left completed at 2 iterations, as it was (its config and every "
        "committed row); free space or raise the limit (ulimit -f), then run the same command again to extend it"
    )
    assert message.count("free space") == 1  # the space line's own advice (resume the run) is not said too
    assert lake.committed_iterations(RUN) == [0, 1, 2]
    assert lake.commit_payload(RUN, 2) == payload and payload["updated"] is False
    assert lake.read_manifest(RUN) == stored and stored.status == "completed"
    assert _every_row(lake) == rows  # the final validation's rows as they were, the extension's gone
    assert [updates for updates, _ in lake.list_checkpoints(RUN)] == [1, 2]
    assert lake.finished_stages(RUN, 2) == []


def test_an_extension_that_fails_after_its_first_commit_is_the_longer_run_failed_and_resumable(tmp_path, records):
    """Once the reopened iteration is committed as a training iteration, the final validation it replaced is gone for
    good: a later failure is recorded as any run's (failed, the longer config, its last commit), never undone."""
    session, stored, _ = _reopened_run(tmp_path, records)
    lake = session.lake
    commit_iteration(session, 2, IterationState({**KEPT, "actor/loss": 2.0}, updated=True))
    assert session.record.stopped(RuntimeError("the env fell over")) is None
    manifest = lake.read_manifest(RUN)
    assert (manifest.status, manifest.last_committed_iteration) == ("failed", 2)
    assert manifest.error == "RuntimeError: the env fell over"
    assert manifest.config["trainer"]["iterations"] == 4 != stored.config["trainer"]["iterations"]
    assert lake.committed_iterations(RUN) == [0, 1, 2] and lake.commit_payload(RUN, 2)["updated"] is True
