"""Shared fixtures: quiet, offline, single-process settings; the tiny model built once per session."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402

from ragen_core.config import TinyModelConfig  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model, built once for the whole session."""
    from ragen_core.policy import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir: Path):
    """(model, tokenizer) of the tiny model; tests must not train this shared instance."""
    from ragen_core.policy import load_policy

    return load_policy(tiny_model_dir)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory):
    """A temporary Prefect server and database for flow tests."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect_home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
