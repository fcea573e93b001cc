"""A run's status as its manifest records it on a real lake, without a session: running -> failed / interrupted
(where it stopped, its last commit) -> running again on a resume (the stop fields gone, the attempt appended) ->
completed; and a run id taken twice."""

from __future__ import annotations

import pytest

from ragen_core.config import build_config
from ragen_core.run.record import (
    STOP_FIELDS,
    RunExistsError,
    RunRecord,
    check_run_id_free,
    new_manifest,
    resumed_manifest,
)
from ragen_core.storage import DataLake

CONFIG = build_config({}, ["trainer.iterations=3"])


def _record(lake: DataLake, run_id: str = "life") -> RunRecord:
    record = RunRecord(lake, run_id, new_manifest(CONFIG, run_id, None, ["ragen", "train"]))
    record.update()
    return record


def test_a_failure_records_where_it_stopped_and_the_last_commit(tmp_path):
    lake = DataLake(tmp_path)
    record = _record(lake)
    assert lake.read_manifest("life").status == "running"
    lake.commit_iteration("life", 0, {})
    lake.commit_iteration("life", 1, {})
    record.position = {"iteration": 2, "stage": "update"}
    record.stopped(ValueError("bad batch"))
    stored = lake.read_manifest("life")
    assert (stored.status, stored.error, stored.failed_iteration, stored.failed_stage) == (
        "failed",
        "ValueError: bad batch",
        2,
        "update",
    )
    assert stored.last_committed_iteration == 1


def test_an_interruption_before_any_commit_has_no_last_commit(tmp_path):
    lake = DataLake(tmp_path)
    record = _record(lake)
    record.position = {"iteration": 0, "stage": "generate"}
    record.stopped(KeyboardInterrupt())
    stored = lake.read_manifest("life")
    assert (stored.status, stored.interrupted_iteration, stored.interrupted_stage) == ("interrupted", 0, "generate")
    assert stored.last_committed_iteration is None and "error" not in stored.stored()


def test_a_resume_marks_the_run_running_again_without_its_stop_and_then_completed(tmp_path):
    lake = DataLake(tmp_path)
    record = _record(lake)
    record.position = {"iteration": 1, "stage": "commit"}
    record.stopped(RuntimeError("disk"))
    failed = lake.read_manifest("life")
    longer = build_config({}, ["trainer.iterations=5"])
    again = RunRecord(
        lake, "life", resumed_manifest(failed.updated(update_group={"x": 1}), longer, ["ragen", "resume"])
    )
    again.update()
    stored = lake.read_manifest("life")
    assert stored.status == "running" and stored.config["trainer"]["iterations"] == 5
    assert not {"error", "update_group", *STOP_FIELDS} & set(stored.stored())
    assert [attempt["command"] for attempt in stored.resumes] == [["ragen", "resume"]]
    assert stored.created_at == failed.created_at  # the run's first moment is kept
    again.update(status="completed")
    assert lake.read_manifest("life").status == "completed"


def test_a_taken_run_id_is_refused_with_its_status(tmp_path):
    lake = DataLake(tmp_path)
    check_run_id_free(lake, "life")  # free: nothing happens
    _record(lake)
    with pytest.raises(RunExistsError, match=r"^run 'life' already exists in .* \(status: running\); choose a new"):
        check_run_id_free(lake, "life")
