"""Issue 39, item 4: the free-form texts of a flow run's parameters (a config path, overrides, a run id, a data root)
are shown in Prefect's UI as one line with every control character escaped, as the logs are, whoever created the run:
read back from a real Prefect server (the test harness's). The flow itself refuses such a text in one line."""

from __future__ import annotations

import json

import pytest

from ragen_core.config import ConfigError
from ragen_core.monitor.reports import escape_controls
from ragen_core.storage.names import InvalidRunIdError

CONTROLS = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]]
HOSTILE_OVERRIDE = 'env.options={low_name: "Ph\\x1b[2Joenix"}'  # YAML's escape: the value holds an ESC
HOSTILE_PATH = "configs/bandit.yaml\nFAKE LOG LINE\x1b[2J\x07"


def _stored(flow_run_id) -> dict:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    return {"name": run.name, "parameters": run.parameters}


def _has_control(value) -> bool:
    return any(c in json.dumps(value, ensure_ascii=False) for c in CONTROLS)


def _last_train_run():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["train"])), sort=FlowRunSort.START_TIME_DESC, limit=5
        )
    return max(runs, key=lambda run: run.created)


def test_a_called_flow_stores_its_texts_escaped_and_refuses_them(prefect_harness, tmp_path):
    """Called from Python (the command line's path): the flow run is created with the parameters escaped; the flow
    then refuses the override (the config's rule) and the run id, each in one line, before anything is created."""
    from flows.train import train

    root = tmp_path / "root\x1b]0;title\x07"
    with pytest.raises(ConfigError) as refused:
        train(config="configs/bandit.yaml", data_root=str(root), overrides=[HOSTILE_OVERRIDE])
    assert "holds the control character '\\x1b'" in str(refused.value)
    stored = _stored(_last_train_run().id)
    assert stored["parameters"]["overrides"] == ['env.options={low_name: "Ph\\x1b[2Joenix"}']  # YAML's own text
    assert stored["parameters"]["data_root"] == escape_controls(str(root)) != str(root)
    assert stored["parameters"]["data_root"].endswith("root\\x1b]0;title\\x07")
    assert not _has_control(stored)
    assert not root.exists()

    hostile_id = "r\nFAKE\x1b[2J"
    with pytest.raises(InvalidRunIdError):
        train(config=HOSTILE_PATH, data_root=str(tmp_path / "other"), run_id=hostile_id)
    stored = _stored(_last_train_run().id)
    assert stored["name"] == "r\\x0aFAKE\\x1b[2J"  # named after the id before the flow checks it: escaped
    assert stored["parameters"]["run_id"] == "r\\x0aFAKE\\x1b[2J"
    assert stored["parameters"]["config"] == "configs/bandit.yaml\\x0aFAKE LOG LINE\\x1b[2J\\x07"
    assert not _has_control(stored)


def test_a_run_created_elsewhere_has_its_stored_texts_escaped_when_its_flow_starts(prefect_harness, tmp_path):
    """A deployment run created from the UI or the API stores its parameters as typed; the worker runs the flow with
    them (here: Prefect's own ``run_flow``, as the worker calls it). The flow escapes the stored copy first, then
    refuses the text."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    from flows.train import train

    raw = {"config": HOSTILE_PATH, "data_root": str(tmp_path / "root"), "overrides": ["seed=1\n\x1b[31mred"]}
    with get_client(sync_client=True) as client:
        created = client.create_flow_run(train, parameters=raw)
    assert _stored(created.id)["parameters"] == raw  # stored as typed: what the flow must mend (the test can fail)
    state = run_flow(train, flow_run=created, parameters=raw, return_type="state")
    assert state.is_failed()
    stored = _stored(created.id)
    assert stored["parameters"] == {
        "config": "configs/bandit.yaml\\x0aFAKE LOG LINE\\x1b[2J\\x07",
        "data_root": str(tmp_path / "root"),
        "overrides": ["seed=1\\x0a\\x1b[31mred"],
    }
    assert not _has_control(stored)
    assert not (tmp_path / "root").exists()
