"""prefect.yaml, read as Prefect reads it (YAML with anchors): every deployment names a real flow, passes only
parameters that flow takes, and the example sweeps (defaults and schedule) plan into valid points."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml

from ragen_core.config import load_config
from ragen_core.sweep import plan_sweep

PROJECT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((PROJECT / "prefect.yaml").read_text())


def _flow(entrypoint: str):
    path, name = entrypoint.split(":")
    return getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)


def test_every_deployment_names_a_flow_and_passes_only_its_parameters():
    names = {d["name"] for d in SPEC["deployments"]}
    assert names == {"train", "sweep", "evaluate", "retrain-offline"}
    for deployment in SPEC["deployments"]:
        flow = _flow(deployment["entrypoint"])
        accepted = set(inspect.signature(flow.fn).parameters)
        assert "progress" not in accepted, deployment["name"]  # the caller's callbacks: a context, never a parameter
        schedules = deployment.get("schedules", [])
        parameter_sets = [deployment.get("parameters", {})] + [s["parameters"] for s in schedules]
        for parameters in parameter_sets:
            assert set(parameters) <= accepted, (deployment["name"], set(parameters) - accepted)
        assert deployment["work_pool"]["name"] == "local-process"
    step = {"ragen_cli.deploy_steps.set_project_directory": {"default": "{{ $RAGEN_PROJECT_DIR }}"}}
    assert SPEC["pull"] == [step]


def test_the_pull_step_takes_the_worker_host_s_checkout_at_run_time(tmp_path, monkeypatch):
    from ragen_cli.deploy_steps import set_project_directory

    here, there = tmp_path / "deployed", tmp_path / "this-host"
    for folder in (here, there):
        (folder / "flows").mkdir(parents=True)
        (folder / "flows" / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAGEN_PROJECT_DIR", str(there))  # the worker's environment on its host
    assert set_project_directory(str(here)) == {"directory": str(there)} and Path.cwd() == there
    monkeypatch.delenv("RAGEN_PROJECT_DIR")
    assert set_project_directory(str(here)) == {"directory": str(here)} and Path.cwd() == here
    monkeypatch.setenv("RAGEN_PROJECT_DIR", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="holds no checkout of ragen-flows .* set RAGEN_PROJECT_DIR"):
        set_project_directory(str(here))
    assert Path.cwd() == here  # refused before any change


def test_the_example_sweeps_plan_into_valid_points():
    sweep = next(d for d in SPEC["deployments"] if d["name"] == "sweep")
    for parameters in [sweep["parameters"]] + [s["parameters"] for s in sweep["schedules"]]:
        base = load_config(PROJECT / parameters["config"]).to_dict()
        plan = plan_sweep(base, parameters["grid"], seeds=parameters["seeds"])
        assert len(plan.points) >= 2
    scheduled = sweep["schedules"][0]["parameters"]
    assert (
        len(
            plan_sweep(
                load_config(PROJECT / scheduled["config"]).to_dict(), scheduled["grid"], seeds=scheduled["seeds"]
            ).points
        )
        == 2 * 2 * 3
    )
