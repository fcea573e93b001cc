"""``monitor.trackers`` in the config: its default, the old ``monitor.tensorboard`` flag read as it (stored runs
resume unchanged), names checked against the registry and the installed packages when the config loads (one line,
before anything is created), and the tracker keys a stored config may not choose (a tracking server, a W&B project)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_core.config import ConfigError, build_config, stored_config
from ragen_core.config.trust import TRUSTED_PATHS_VARIABLE, StoredConfig, UntrustedConfigError, local_store_path
from ragen_core.monitor.trackers import TRACKERS, TrackerSpec
from ragen_core.run.checks import build_run_config, build_stored_run_config
from ragen_core.run.decisions import config_changes


def test_tensorboard_is_the_default_tracker_and_the_old_flag_reads_as_the_list():
    assert build_config({}).monitor.trackers == ["tensorboard"]
    assert build_config({}, ["monitor.tensorboard=false"]).monitor.trackers == []
    assert build_config({}, ["monitor.tensorboard=true"]).monitor.trackers == ["tensorboard"]
    both = build_config({"monitor": {"tensorboard": True, "trackers": ["tensorboard", "mlflow"]}})
    assert both.monitor.trackers == ["tensorboard", "mlflow"]  # the flag agrees with the list: fine
    assert "tensorboard" not in build_config({}).to_dict()["monitor"]  # the resolved config spells the list only


@pytest.mark.parametrize(
    ("monitor", "message"),
    [
        ({"tensorboard": False, "trackers": ["tensorboard"]}, "monitor.tensorboard=false contradicts"),
        ({"tensorboard": "yes"}, "monitor.tensorboard must be true or false"),
        ({"trackers": ["mlflow", "mlflow"]}, "mlflow listed twice"),
        ({"trackers": ["MLflow"]}, "lowercase words"),
        ({"trackers": "mlflow"}, "monitor.trackers"),
        ({"mlflow": {"tracking_uri": ""}}, "monitor.mlflow.tracking_uri"),
    ],
)
def test_a_bad_tracker_setting_names_its_key(monitor, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"monitor": monitor})


def test_a_run_stored_with_the_tensorboard_flag_resumes_with_the_same_trackers():
    new = build_config({}).to_dict()
    for flag, trackers in ((True, ["tensorboard"]), (False, [])):
        old = copy.deepcopy(new)
        del old["monitor"]["trackers"], old["monitor"]["mlflow"], old["monitor"]["wandb"]
        old["monitor"]["tensorboard"] = flag  # a manifest written before monitor.trackers
        assert build_config(stored_config(old)).monitor.trackers == trackers
        same = build_config({}, [f"monitor.trackers={trackers}"]).to_dict()
        assert config_changes(old, same) == []  # resumed with its own trackers: no change
        other = build_config({}, [f"monitor.trackers={['tensorboard'] if not flag else []}"]).to_dict()
        assert config_changes(old, other) == ["monitor.trackers"]


def test_an_unknown_tracker_or_one_whose_package_is_missing_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'; registered: mlflow, tensorboard, wandb"):
        build_run_config({"monitor": {"trackers": ["neptune"]}})
    TRACKERS.add("ghost", TrackerSpec(lambda run: None, package="ragen_no_such_tracker_package", extra="ghost"))
    try:
        with pytest.raises(ConfigError) as raised:
            build_run_config({"monitor": {"trackers": ["tensorboard", "ghost"]}})
    finally:
        TRACKERS.remove("ghost")
    assert "ghost needs the ragen_no_such_tracker_package package, which is not installed" in str(raised.value)
    assert "pip install 'ragen-flows[ghost]' (or `make install-trackers`)" in str(raised.value)


def test_train_with_a_tracker_not_installed_is_one_line_before_anything_is_created(tmp_path):
    from ragen_cli.main import app

    root = tmp_path / "never-made"
    TRACKERS.add("ghost", TrackerSpec(lambda run: None, package="ragen_no_such_tracker_package", extra="ghost"))
    try:
        result = CliRunner().invoke(
            app, ["train", "--config", "configs/bandit.yaml", "--data-root", str(root), "monitor.trackers=[ghost]"]
        )
    finally:
        TRACKERS.remove("ghost")
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ragen-flows[ghost]'" in lines[0], result.stderr
    assert not root.exists()


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("sqlite:////data/runs/mlflow.db", "/data/runs/mlflow.db"),
        ("sqlite:///mlflow.db?timeout=5", "mlflow.db"),
        ("file:///data/mlruns", "/data/mlruns"),
        ("/data/mlruns", "/data/mlruns"),
        ("http://tracking.example:5000", None),
        ("https://tracking.example", None),
        ("postgresql://user@db.example/mlflow", None),
        ("file://other-host/data/mlruns", None),
        ("databricks", None),
        ("databricks://profile", None),
    ],
)
def test_a_tracking_uri_names_a_local_store_or_a_host(uri, path):
    assert local_store_path(uri) == path


def _stored(root: Path, monitor: dict) -> StoredConfig:
    return StoredConfig({"monitor": monitor}, "runs/r/manifest.json", root)


@pytest.fixture(autouse=True)
def no_trusted_folders(monkeypatch):
    """Only the data root is trusted here (the session trusts its temporary folders, tests/conftest.py)."""
    monkeypatch.delenv(TRUSTED_PATHS_VARIABLE, raising=False)


@pytest.mark.parametrize(
    ("monitor", "key"),
    [
        ({"mlflow": {"tracking_uri": "http://tracking.example:5000"}}, "monitor.mlflow.tracking_uri"),
        ({"mlflow": {"tracking_uri": "sqlite:////elsewhere/mlflow.db"}}, "monitor.mlflow.tracking_uri"),
        ({"wandb": {"project": "someone-elses"}}, "monitor.wandb.project"),
        ({"wandb": {"entity": "someone-elses-team"}}, "monitor.wandb.entity"),
    ],
)
def test_a_stored_tracking_server_or_project_is_used_only_when_named_again(tmp_path, monkeypatch, monitor, key):
    for name in ("MLFLOW_TRACKING_URI", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    section, field = key.split(".")[1:]
    value = monitor[section][field]
    with pytest.raises(UntrustedConfigError, match=f"runs/r/manifest.json sets {key}="):
        build_stored_run_config(_stored(tmp_path, monitor))
    again = build_stored_run_config(_stored(tmp_path, monitor), [f"{key}={value}"])
    assert getattr(getattr(again.monitor, section), field) == value
    env = {"tracking_uri": "MLFLOW_TRACKING_URI", "project": "WANDB_PROJECT", "entity": "WANDB_ENTITY"}[field]
    monkeypatch.setenv(env, value)
    assert getattr(getattr(build_stored_run_config(_stored(tmp_path, monitor)).monitor, section), field) == value


def test_a_stored_store_inside_the_data_root_or_a_trusted_folder_needs_no_naming(tmp_path, monkeypatch):
    root, store = tmp_path / "root", tmp_path / "team" / "mlflow.db"
    inside = f"sqlite:///{root / 'shared' / 'mlflow.db'}"
    config = build_stored_run_config(_stored(root, {"mlflow": {"tracking_uri": inside}, "trackers": ["mlflow"]}))
    assert config.monitor.mlflow.tracking_uri == inside
    with pytest.raises(UntrustedConfigError, match="a tracking server or a store outside the data root"):
        build_stored_run_config(_stored(root, {"mlflow": {"tracking_uri": f"sqlite:///{store}"}}))
    monkeypatch.setenv(TRUSTED_PATHS_VARIABLE, str(store.parent))
    assert build_stored_run_config(_stored(root, {"mlflow": {"tracking_uri": f"sqlite:///{store}"}}))
