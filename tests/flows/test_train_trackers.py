"""End to end through the train flow (tiny Bandit runs): ``monitor.trackers=[tensorboard, mlflow, wandb]`` in their
local / offline modes. Every scalar is read back through each tracker's own reader (TensorBoard's event
accumulator, MLflow's ``MlflowClient``, W&B's transaction log decoded with wandb's protobuf classes) and compared
with the ``metrics`` table as DuckDB reads it from the Parquet files; params, tags, the plot and the end status too.
A resumed run continues the same MLflow and W&B runs; a tracker that fails mid-run (one that raises, MLflow's store
made read-only) is warned of once and the run completes with every lake row."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_core.monitor.trackers import TRACKERS, TrackerSpec, wandb_log
from ragen_core.monitor.trackers.wandb_log import config_of, exit_code, history, read_records, run_record
from ragen_core.storage import DataLake
from ragen_core.storage.maintenance import runs_overview
from tests.flows.test_train_tensorboard import small_config
from tests.monitor.test_tensorboard_sink import duckdb_metrics, read_events

ALL = ["tensorboard", "mlflow", "wandb"]


@pytest.fixture(autouse=True)
def local_trackers(monkeypatch):
    """Trackers in their defaults: no tracking server, no W&B mode or project from the environment."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def _config(model_dir, iterations: int, trackers: list[str]) -> dict:
    return small_config(model_dir, iterations, {"trackers": trackers})


def same_points(got: dict, expected: dict) -> bool:
    """Equal tag for tag, step for step, value for value (nan equal to nan)."""
    if set(got) != set(expected):
        return False
    return all(
        len(got[k]) == len(expected[k])
        and all(
            s == t and (v == w or math.isnan(v) and math.isnan(w))
            for (s, v), (t, w) in zip(got[k], expected[k], strict=True)
        )
        for k in expected
    )


def mlflow_points(client, mlflow_run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric's history, as MLflow's client returns it, sorted by step."""
    names = client.get_run(mlflow_run_id).data.metrics
    return {name: sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run_id, name)) for name in names}


def mlflow_client(run_dir):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'trackers' / 'mlflow' / 'mlflow.db'}")


def wandb_logs(run_dir) -> list:
    """The run's W&B transaction logs, one per attempt, oldest first."""
    return sorted((run_dir / "trackers" / "wandb").glob("offline-run-*/run-*.wandb"))


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_every_scalar_reaches_tensorboard_mlflow_and_wandb_at_its_iteration(
    prefect_harness, tmp_path, tiny_model_dir, capsys
):
    from flows.train import train

    root = tmp_path / "lake"
    train(_config(tiny_model_dir, 2, ALL), data_root=str(root), run_id="trk")
    lake = DataLake(root)
    assert lake.committed_iterations("trk") == [0, 1, 2]
    expected = duckdb_metrics(root, "trk", float32=False)
    assert len(expected) > 20 and [s for s, _ in expected["val/bandit/success"]] == [0, 2]
    # the update's cost at every iteration that updated, and the run's mean MFU in `ragen runs`
    perf = {"perf/update_s", "perf/model_tflop", "perf/tflops", "perf/mfu", "perf/tokens_per_s", "perf/peak_rss_gb"}
    assert all([s for s, _ in expected[name]] == [0, 1] for name in perf), sorted(expected)
    mfus = [value for _, value in expected["perf/mfu"]]
    [listed] = runs_overview(lake).to_pylist()
    assert 0 < listed["mfu"] == pytest.approx(round(sum(mfus) / len(mfus), 4), abs=1e-12)
    run_dir = lake.run_dir("trk")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    state = json.loads((run_dir / "trackers" / "state.json").read_text())

    assert read_events(lake.tensorboard_dir("trk")) == duckdb_metrics(root, "trk")  # float32, as TensorBoard keeps

    client = mlflow_client(run_dir)
    found = client.get_run(state["mlflow"]["run_id"])
    in_mlflow = {name.replace("@", "_at_"): points for name, points in expected.items()}  # val/bandit/pass@k
    assert "val/bandit/pass_at_k" in in_mlflow and same_points(mlflow_points(client, found.info.run_id), in_mlflow)
    assert found.info.run_name == "trk" and found.info.status == "FINISHED"
    stored = flat(manifest["config"])
    assert found.data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in stored.items()}
    assert {k: v for k, v in found.data.tags.items() if k.startswith("ragen.")} == {
        "ragen.run_id": "trk",
        "ragen.env": "bandit",
        "ragen.preset": manifest["config"]["algorithm"]["preset"],
        "ragen.config_hash": manifest["config_hash"],
    }
    artifacts = [f.path for f in client.list_artifacts(found.info.run_id)]
    assert artifacts == ["collapse-indicators.png"]
    png = client.download_artifacts(found.info.run_id, "collapse-indicators.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    [log] = wandb_logs(run_dir)
    records = read_records(log)
    assert same_points(history(records), expected)
    run = run_record(records)
    assert (run.run_id, run.display_name, run.project) == (state["wandb"]["id"], "trk", "ragen")
    preset, config_hash = manifest["config"]["algorithm"]["preset"], manifest["config_hash"]
    assert sorted(run.tags) == sorted(["env:bandit", f"preset:{preset}", f"config_hash:{config_hash}"])
    assert config_of(run) == stored
    assert exit_code(records) == 0
    assert (log.parent / "files" / "collapse-indicators.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {name: entry["logged"] for name, entry in state.items()} == {name: 2 for name in ALL}
    # the reader a user runs on the offline run (wandb 0.31 has none): the lake's numbers, the last as the summary
    read = subprocess.run(
        [sys.executable, "-m", "ragen_core.monitor.trackers.wandb_log", str(run_dir / "trackers" / "wandb")],
        capture_output=True,
        text=True,
        check=True,
    )
    [attempt] = json.loads(read.stdout)
    assert attempt["id"] == state["wandb"]["id"] and attempt["exit_code"] == 0 and attempt["config"] == stored
    assert same_points({name: [tuple(p) for p in points] for name, points in attempt["history"].items()}, expected)
    assert attempt["summary"] == {name: points[-1][1] for name, points in sorted(expected.items())}
    # a folder with no offline run: the same reader's entry (its `main`, which the command exits with), in this
    # process: a second interpreter importing wandb's protobuf classes would add seconds and prove nothing more
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert wandb_log.main([str(tmp_path / "empty")]) == 1
    missing = capsys.readouterr()
    assert missing.out == "" and missing.err.count("\n") == 1 and "no W&B offline run" in missing.err


class Crash(BaseException):
    """A crash landing inside a tracker (as a kill or a Ctrl-C could): not a tracker's error, so it stops the run."""


class Breaking:
    """A tracker that logs nothing and, at ``at`` (once per process), runs ``action`` (raise, break a store)."""

    def __init__(self, at: int, action) -> None:
        self.at, self.action, self.done = at, action, False

    def spec(self) -> TrackerSpec:
        return TrackerSpec(lambda run: self, takes_plot=False)

    def state(self) -> dict:
        return {}

    def log(self, step: int, scalars) -> None:
        if step == self.at and not self.done:
            self.done = True
            self.action()

    def finish(self, status, plot) -> None:
        return None


@pytest.fixture()
def register():
    """Register test trackers by name for one test."""
    added: list[str] = []

    def add(name: str, spec: TrackerSpec) -> None:
        TRACKERS.add(name, spec)
        added.append(name)

    yield add
    for name in added:
        TRACKERS.remove(name)


@pytest.fixture()
def warnings_seen():
    """The ragen.monitor warnings of the test (a handler of our own: Prefect reconfigures the root logger)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("ragen.monitor")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def test_a_resumed_run_continues_the_same_mlflow_and_wandb_runs(prefect_harness, tmp_path, tiny_model_dir, register):
    from flows.train import train

    def crash() -> None:
        raise Crash("killed after iteration 1's commit")

    register("crash_at_1", Breaking(1, crash).spec())
    config, root = _config(tiny_model_dir, 3, [*ALL, "crash_at_1"]), tmp_path / "lake"
    with pytest.raises(Crash):
        train(config, data_root=str(root), run_id="trk-r")
    lake = DataLake(root)
    run_dir = lake.run_dir("trk-r")
    assert lake.committed_iterations("trk-r") == [0, 1]
    first = json.loads((run_dir / "trackers" / "state.json").read_text())
    client = mlflow_client(run_dir)
    assert client.get_run(first["mlflow"]["run_id"]).info.status == "FAILED"
    assert {name: first[name]["logged"] for name in ALL} == {name: 1 for name in ALL}

    train(config, data_root=str(root), run_id="trk-r")  # the stored run, resumed
    assert lake.committed_iterations("trk-r") == [0, 1, 2, 3]
    state = json.loads((run_dir / "trackers" / "state.json").read_text())
    assert state["mlflow"]["run_id"] == first["mlflow"]["run_id"] and state["wandb"]["id"] == first["wandb"]["id"]
    expected = duckdb_metrics(root, "trk-r", float32=False)
    found = client.get_run(state["mlflow"]["run_id"])
    assert found.info.status == "FINISHED" and len(client.search_runs([found.info.experiment_id])) == 1
    in_mlflow = {name.replace("@", "_at_"): points for name, points in expected.items()}
    assert same_points(mlflow_points(client, found.info.run_id), in_mlflow)  # each iteration once
    logs = wandb_logs(run_dir)
    assert len(logs) == 2  # one offline log per attempt, one W&B run id: `wandb sync` appends them
    attempts = [read_records(log) for log in logs]
    assert {run_record(records).run_id for records in attempts} == {state["wandb"]["id"]}
    assert [exit_code(records) for records in attempts] == [1, 0]
    merged: dict[str, list] = {}
    for records in attempts:
        for name, points in history(records).items():
            merged.setdefault(name, []).extend(points)
    assert same_points(merged, expected)
    assert read_events(lake.tensorboard_dir("trk-r")) == duckdb_metrics(root, "trk-r")


def read_only(folder: Path) -> bool:
    """Make ``folder`` read-only for everyone, root too (a read-only bind mount); False where mounting is refused."""
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if bound.returncode != 0:
        return False
    remounted = subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True)
    if remounted.returncode != 0:
        subprocess.run(["umount", str(folder)], check=False)
        return False
    return True


def test_a_tracker_failing_mid_run_is_warned_once_and_the_run_completes_with_every_row(
    prefect_harness, tmp_path, tiny_model_dir, register, warnings_seen
):
    """At iteration 1 a tracker raises, having first made MLflow's store read-only (a bind mount; root only: where
    mounting is refused, MLflow keeps working and only the raising tracker fails)."""
    from flows.train import train

    root, mounted = tmp_path / "lake", []

    def break_mlflow_then_raise() -> None:
        store = DataLake(root).trackers_dir("trk-f") / "mlflow"
        if read_only(store):
            mounted.append(store)
        raise RuntimeError("the breaking tracker's own error\nwith a second line")

    register("breaking", Breaking(1, break_mlflow_then_raise).spec())
    try:
        train(_config(tiny_model_dir, 2, ["tensorboard", "breaking", "mlflow"]), data_root=str(root), run_id="trk-f")
    finally:
        for store in mounted:
            subprocess.run(["umount", str(store)], check=False)
    lake = DataLake(root)
    run_dir = lake.run_dir("trk-f")
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
    assert lake.committed_iterations("trk-f") == [0, 1, 2]
    expected = duckdb_metrics(root, "trk-f", float32=False)
    assert {i for points in expected.values() for i, _ in points} == {0, 1, 2}  # every iteration's rows
    assert read_events(lake.tensorboard_dir("trk-f")) == duckdb_metrics(root, "trk-f")  # the others go on
    failed = [line for line in warnings_seen if "tracker" in line and "failed" in line]
    assert [line.split(" failed")[0] for line in failed] == ["run trk-f: tracker breaking"] + (
        ["run trk-f: tracker mlflow"] if mounted else []
    )
    assert all("\n" not in line for line in failed) and "(iteration 1: RuntimeError: the breaking" in failed[0]
    state = json.loads((run_dir / "trackers" / "state.json").read_text())
    client = mlflow_client(run_dir)
    in_mlflow = {name.replace("@", "_at_"): points for name, points in expected.items()}
    if mounted:
        assert "OperationalError" in failed[1]  # SQLite's, which the store could not write
        assert state["mlflow"]["logged"] == 0
        only_first = {name: [p for p in points if p[0] == 0] for name, points in in_mlflow.items()}
        got = mlflow_points(client, state["mlflow"]["run_id"])
        assert same_points(got, {name: points for name, points in only_first.items() if points})
    else:
        assert same_points(mlflow_points(client, state["mlflow"]["run_id"]), in_mlflow)
    assert state["breaking"]["logged"] == 0
