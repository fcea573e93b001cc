"""A command's flow runs send Prefect heartbeats to the user's server and none to the command's own temporary one,
where nobody can read them and each flow run would wait up to a second at its end for the heartbeat thread."""

from __future__ import annotations

import pytest
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

from ragen_cli import launch


@flow
def _heartbeat_seconds() -> int | None:
    """The heartbeat interval the flow run engine reads when it starts a run (None: it sends none)."""
    return get_current_settings().flows.heartbeat_frequency


@pytest.mark.parametrize(("own", "expected"), [(True, None), (False, 60)])
def test_heartbeats_are_off_on_the_commands_own_server_only(prefect_harness, monkeypatch, own, expected):
    monkeypatch.setitem(launch._SERVER, "own", own)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}):  # what a user's settings say
        with launch.watch_run():
            assert _heartbeat_seconds() == expected
        assert _heartbeat_seconds() == 60  # the command's context ends with it
