"""A run's trackers together (:class:`RunTrackers`), on a real lake with committed metrics rows and the real
TensorBoard tracker: started at the first commit they see, catching up from the ``metrics`` table on what the state
file says they missed, a tracker that fails to start or to log left out with one warning, the state file kept."""

from __future__ import annotations

import json
import logging

import pytest

from ragen_core.config import build_config
from ragen_core.monitor.tensorboard_sink import event_file_name
from ragen_core.monitor.trackers import TRACKERS, RunTrackers, TrackerSpec
from ragen_core.monitor.trackers.base import flat_params, one_line
from ragen_core.monitor.trackers.fanout import STATE_FILE
from tests.monitor.test_tensorboard_sink import _lake_with_metrics, read_events


def _trackers(lake, run_id: str, names: list[str]) -> RunTrackers:
    return RunTrackers(build_config({"monitor": {"trackers": names}}), lake, run_id)


@pytest.fixture()
def warnings_seen():
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("ragen.monitor")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


class Failing:
    """A registered tracker that raises ``error`` when opened (``at=None``) or when it logs step ``at``."""

    def __init__(self, at: int | None, error: Exception) -> None:
        self.at, self.error, self.logged = at, error, []

    def open(self, run):
        if self.at is None:
            raise self.error
        return self

    def state(self) -> dict:
        return {}

    def log(self, step, scalars) -> None:
        if step == self.at:
            raise self.error
        self.logged.append(step)

    def finish(self, status, plot) -> None:
        return None


@pytest.fixture()
def failing():
    added: list[str] = []

    def add(name: str, tracker: Failing) -> Failing:
        TRACKERS.add(name, TrackerSpec(tracker.open, takes_plot=False))
        added.append(name)
        return tracker

    yield add
    for name in added:
        TRACKERS.remove(name)


def test_the_first_log_catches_up_on_the_committed_iterations_the_state_says_were_missed(tmp_path):
    lake, written = _lake_with_metrics(tmp_path, "run-a", 5)
    folder = lake.trackers_dir("run-a")
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text(json.dumps({"tensorboard": {"logged": 1}}))  # an earlier attempt logged 0, 1
    trackers = _trackers(lake, "run-a", ["tensorboard"])
    trackers.log(4, written[4])
    names = sorted(p.name for p in lake.tensorboard_dir("run-a").iterdir())
    assert names == [event_file_name(i) for i in (2, 3, 4)]
    events = read_events(lake.tensorboard_dir("run-a"))
    assert events["rollout/reward_mean"] == [(i, pytest.approx(i / 3, rel=1e-7)) for i in (2, 3, 4)]
    assert json.loads((folder / STATE_FILE).read_text()) == {"tensorboard": {"logged": 4}}


def test_without_a_readable_state_every_committed_iteration_is_logged(tmp_path):
    lake, written = _lake_with_metrics(tmp_path, "run-a", 3)
    folder = lake.trackers_dir("run-a")
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text("{not json")  # a damaged state: the tracker catches up from the start
    _trackers(lake, "run-a", ["tensorboard"]).log(3, {"x": 1.0})
    assert sorted(p.name for p in lake.tensorboard_dir("run-a").iterdir()) == [event_file_name(i) for i in range(4)]


def test_a_tracker_failing_to_start_or_to_log_is_warned_once_and_the_others_go_on(tmp_path, failing, warnings_seen):
    lake, written = _lake_with_metrics(tmp_path, "run-a", 4)
    failing("no_start", Failing(None, ConnectionError("no route to host\nsecond line")))
    flaky = failing("flaky", Failing(1, OSError("store gone")))
    trackers = _trackers(lake, "run-a", ["no_start", "flaky", "tensorboard"])
    for iteration in range(4):
        trackers.log(iteration, written[iteration])
    trackers.finish("completed")
    assert flaky.logged == [0]
    assert sorted(p.name for p in lake.tensorboard_dir("run-a").iterdir()) == [event_file_name(i) for i in range(4)]
    assert warnings_seen == [
        "run run-a: tracker no_start failed (start: ConnectionError: no route to host); it gets nothing more in this "
        "attempt. The metrics table has every point, and the run's next attempt (a resume) logs the ones it missed",
        "run run-a: tracker flaky failed (iteration 1: OSError: store gone); it gets nothing more in this attempt. "
        "The metrics table has every point, and the run's next attempt (a resume) logs the ones it missed",
    ]
    state = json.loads((lake.trackers_dir("run-a") / STATE_FILE).read_text())
    assert state == {"flaky": {"logged": 0}, "tensorboard": {"logged": 3}}  # the next attempt logs flaky's 1, 2, 3


def test_no_trackers_write_nothing_and_an_unstarted_set_finishes_quietly(tmp_path):
    lake, written = _lake_with_metrics(tmp_path, "run-a", 2)
    _trackers(lake, "run-a", []).log(1, written[1])
    _trackers(lake, "run-a", ["tensorboard"]).finish("failed")  # no commit this attempt: nothing started
    assert not lake.trackers_dir("run-a").exists() and not lake.tensorboard_dir("run-a").exists()


def test_params_are_the_config_flattened_and_errors_one_line():
    params = flat_params(build_config({}, ["env.val_envs=[bandit, sokoban]"]).to_dict())
    assert params["env.val_envs"] == ["bandit", "sokoban"] and params["actor.lr"] == build_config({}).actor.lr
    assert params["monitor.trackers"] == ["tensorboard"] and "env.options" not in params  # {} gives no key
    try:
        try:
            raise OSError("disk full")
        except OSError as cause:
            raise RuntimeError("(raised as a result of autoflush)\nSQL: INSERT ...") from cause
    except RuntimeError as exc:
        assert one_line(exc) == "RuntimeError: (raised as a result of autoflush) (from OSError: disk full)"
    assert one_line(ValueError("x" * 400)) == ("ValueError: " + "x" * 400)[:297] + "..."


def test_a_link_planted_as_a_trackers_folder_is_refused_and_nothing_is_written_through_it(tmp_path, warnings_seen):
    lake, written = _lake_with_metrics(tmp_path, "run-a", 1)
    outside = tmp_path / "outside"
    outside.mkdir()
    lake.trackers_dir("run-a").mkdir(parents=True)
    (lake.trackers_dir("run-a") / "mlflow").symlink_to(outside)
    trackers = _trackers(lake, "run-a", ["mlflow", "tensorboard"])
    trackers.log(0, written[0])
    trackers.finish("completed")
    assert list(outside.iterdir()) == []
    assert [line.split(" (")[0] for line in warnings_seen] == ["run run-a: tracker mlflow failed"]
    assert "symbolic link" in warnings_seen[0] or "link" in warnings_seen[0]
    assert [p.name for p in lake.tensorboard_dir("run-a").iterdir()] == [event_file_name(0)]
