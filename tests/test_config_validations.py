"""A config is validated once on every path that builds one for a run: the flow entry, a sweep's base and each of
its points, a finding's variants, and a whole sweep run as the CLI runs it (planned once, its points' configs handed
to the runs as they are). Validations are counted on ``RunConfig.model_validate``, the one door of
``ragen_core.config.build_config``."""

from __future__ import annotations

from collections import Counter

import pytest

from ragen_core.config import RunConfig
from ragen_core.findings import load_finding, plan_finding
from ragen_core.run.checks import build_run_config
from ragen_core.run.requests import resolve_config
from ragen_core.sweep import plan_sweep

BASE = {"trainer": {"iterations": 3}, "rollout": {"env_groups": 2, "group_size": 2}}


@pytest.fixture
def validations(monkeypatch) -> Counter:
    """Counts ``RunConfig.model_validate`` calls, by the config's ``seed`` and ``algorithm.filter_ratio`` (which tell
    the sweeps' points apart)."""
    counted: Counter = Counter()
    validate = RunConfig.model_validate.__func__

    def counting(cls, tree, *args, **kwargs):
        config = validate(cls, tree, *args, **kwargs)
        counted[(config.seed, config.algorithm.filter_ratio)] += 1
        return config

    monkeypatch.setattr(RunConfig, "model_validate", classmethod(counting))
    return counted


def test_the_flow_entry_validates_a_tree_or_a_file_once_and_a_config_never(validations):
    config = resolve_config(BASE)
    assert sum(validations.values()) == 1
    assert resolve_config(config) is config and sum(validations.values()) == 1  # the CLI's config, as it is
    resolve_config("configs/bandit.yaml")
    resolve_config(config, ["seed=3"])  # overrides on a config: that config is validated once more, with them
    assert sum(validations.values()) == 3


def test_a_sweep_validates_its_base_once_and_each_point_once(validations):
    grid = ["algorithm.filter_ratio=[0.5,1.0]"]
    plan = plan_sweep(BASE, grid, seeds=2)
    assert len(plan.points) == 4
    assert validations == {(0, 0.25): 1, (0, 0.5): 1, (1, 0.5): 1, (0, 1.0): 1, (1, 1.0): 1}
    validations.clear()
    base = build_run_config(BASE)
    plan_sweep(base, grid, seeds=2)  # a validated base (what the CLI and the flow hand on) is not validated again
    assert sum(validations.values()) == 1 + 4
    validations.clear()
    (point,) = plan_sweep(base).points  # no axes: the one point is the base itself
    assert point.config is base and sum(validations.values()) == 0


def test_a_finding_validates_each_variants_base_once_and_each_point_once(validations):
    plans = plan_finding(load_finding("echo_trap"), quick=True)
    points = sum(len(item.plan.points) for item in plans)
    assert len(plans) == 2 and points == 4  # two variants, two quick seeds each
    assert sum(validations.values()) == len(plans) + points


def test_a_sweep_as_the_cli_runs_it_validates_each_config_once(validations, prefect_harness, tmp_path, tiny_model_dir):
    """``ragen sweep``: the request built once (its config loaded and checked: 1, the plan made from it: one per
    point), the flow and its runs take the configs as they are (0)."""
    from flows.sweep import sweep_requested
    from ragen_core.sweep import sweep_request

    overrides = [
        f"model.path={tiny_model_dir}",
        "env.val_envs=[bandit]",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=1",
        "eval.instances=3",
        "bootstrap.enabled=false",
    ]
    request = sweep_request(
        "configs/bandit.yaml", tmp_path, ["algorithm.filter_ratio=[0.5,1.0]"], sweep_id="once", overrides=overrides
    )
    assert sum(validations.values()) == 3
    result = sweep_requested(request)
    assert [row["outcome"] for row in result["points"]] == ["COMPLETED", "COMPLETED"]
    assert sum(validations.values()) == 3
