"""prefect.yaml, read as Prefect reads it (YAML with anchors): every deployment names a real flow, passes only
parameters that flow takes, and the example sweeps (defaults and schedule) plan into valid points."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

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
    step = {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $RAGEN_PROJECT_DIR }}"}}
    assert SPEC["pull"] == [step]


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
