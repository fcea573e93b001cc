"""One request per command (issue 42, section 1): following the data root from ``ragen train`` and from a deployment
run (the ``train`` flow called with plain parameters, as a worker calls it) reaches one request, one config
validation, one ``DataLake``, one take of the run's writer lock and one start decision, counted on the real
components as tests/test_config_validations.py counts validations."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.config import RunConfig
from ragen_core.run import entry, resume
from ragen_core.run.requests import RunRequest
from ragen_core.storage import DataLake

TINY = [
    "trainer.iterations=1",
    "bootstrap.enabled=false",
    "rollout.env_groups=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=6",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size=4",
    "eval.instances=2",
    "env.val_envs=[bandit]",
]


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Counts requests built, configs validated, lakes made, writer locks taken and start decisions."""
    counts: Counter = Counter()

    def counting(name, function):
        def counted_call(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return counted_call

    monkeypatch.setattr(RunRequest, "__init__", counting("request", RunRequest.__init__))
    monkeypatch.setattr(DataLake, "__init__", counting("lake", DataLake.__init__))
    monkeypatch.setattr(entry, "acquire", counting("lock", entry.acquire))
    monkeypatch.setattr(resume, "decide_run_start", counting("start", resume.decide_run_start))
    validate = RunConfig.model_validate.__func__
    monkeypatch.setattr(RunConfig, "model_validate", classmethod(counting("validation", validate)))
    return counts


ONCE = {"request": 1, "validation": 1, "lake": 1, "lock": 1, "start": 1}


def test_ragen_train_builds_one_request_one_lake_one_lock_and_one_start(
    counted, prefect_harness, tmp_path, tiny_model_dir
):
    args = [
        "train",
        "--config",
        "configs/bandit.yaml",
        "--data-root",
        str(tmp_path),
        "--run-id",
        "door-cli",
        f"model.path={tiny_model_dir}",
        *TINY,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert dict(counted) == ONCE
    assert DataLake(tmp_path).read_manifest("door-cli").status == "completed"


def test_a_deployment_run_builds_one_request_one_lake_one_lock_and_one_start(
    counted, prefect_harness, tmp_path, tiny_model_dir
):
    from flows.train import train

    result = train(
        config="configs/bandit.yaml",
        data_root=str(tmp_path),
        run_id="door-flow",
        overrides=[f"model.path={tiny_model_dir}", *TINY],
    )
    assert result["run_id"] == "door-flow"
    assert dict(counted) == ONCE
    counted.clear()
    again = train(
        config="configs/bandit.yaml",
        data_root=str(tmp_path),
        run_id="door-flow",
        overrides=[f"model.path={tiny_model_dir}", *TINY],
    )
    assert again["completed"] is True and dict(counted) == ONCE  # a done run: decided once, nothing else


def test_the_api_builds_one_request_one_lake_one_lock_and_one_start(counted, tmp_path, tiny_model_dir):
    import ragen_core

    result = ragen_core.train("configs/bandit.yaml", tmp_path, "door-api", [f"model.path={tiny_model_dir}", *TINY])
    assert result.status == "completed"
    assert dict(counted) == ONCE
