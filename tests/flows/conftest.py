"""Fixtures shared by several flow test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def whole_bandit_run(tmp_path_factory, tiny_model_dir, prefect_server):
    """The never-stopped reference of the exact-resume tests (tests/flows/test_resume.py's run and config), made once
    per session by the real command: test_resume (killed at five points) and test_interrupts (Ctrl-C) compare their
    resumed runs with it, test_concurrency its run made beside another. Returns its data root."""
    from tests.flows.test_resume import RUN, _overrides, _ragen

    whole = tmp_path_factory.mktemp("whole")
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    rc, output = _ragen(train, whole, None, prefect_server[0].api_url)
    assert rc == 0, output[-3000:]
    return whole
