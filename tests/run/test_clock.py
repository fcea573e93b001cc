"""The stage clock: where the run is (the manifest's position) and how long each stage took, by stage name."""

import pytest

from ragen_core.run.clock import StageClock
from ragen_core.run.record import RunRecord, stop_record
from ragen_core.storage import DataLake
from schemas.manifest import RunManifest


def test_the_clock_times_each_stage_under_its_name_and_a_failure_keeps_where_it_stopped(tmp_path):
    record = RunRecord(DataLake(tmp_path), "clocked", RunManifest(run_id="clocked", status="running"))
    metrics: dict[str, float] = {}
    stage = StageClock(record, 3, metrics)
    with stage("generate"):
        pass
    with stage("filter"):
        pass
    assert sorted(metrics) == ["time/filter", "time/generate"] and all(v >= 0 for v in metrics.values())
    assert record.position == {"iteration": 3, "stage": "filter"}

    with pytest.raises(RuntimeError), stage("update"):
        raise RuntimeError("boom")
    assert "time/update" not in metrics  # a failed stage is not timed
    assert stop_record(RuntimeError("boom"), record.position, [0, 1, 2])["failed_stage"] == "update"
    assert type(record.position["stage"]) is str  # stored in the manifest as plain JSON
