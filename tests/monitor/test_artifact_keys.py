"""Prefect artifact keys of runs and sweeps (issue 39 item 6): one key per run id, each one Prefect accepts."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from prefect.client.schemas.actions import ArtifactCreate

from ragen_core.monitor.reports import artifact_key

# ids that lower to the same slug (a-b), ids of 128 characters, ids that look like a marked stem themselves
LOOKALIKE = "a-b-" + hashlib.sha256(b"A.b").hexdigest()[:12]
IDS = [
    "a-b",
    "A.b",
    "a_b",
    "a.b",
    "A-B",
    "a__b",
    "a-b.",
    "A.B",
    "ab",
    "a-b-metrics",
    "a",
    "A",
    "x" * 128,
    "X" * 128,
    "x" * 127 + ".",
    LOOKALIKE,
    "run",
    "_",
]


def test_every_run_id_has_its_own_key():
    keys = {run_id: artifact_key(run_id) for run_id in IDS}
    assert len(set(keys.values())) == len(IDS), keys
    sweeps = {run_id: artifact_key(run_id, "comparison") for run_id in IDS}
    assert not set(sweeps.values()) & set(keys.values())


def test_a_plain_id_is_its_own_stem_and_any_other_is_marked_with_its_digest():
    assert artifact_key("bg-run") == "ragen-bg-run-metrics"  # unchanged for ids that are already keys
    assert artifact_key("local", "comparison") == "ragen-local-comparison"
    digest = hashlib.sha256(b"A.b").hexdigest()[:12]
    assert artifact_key("A.b") == f"ragen-a-b--{digest}-metrics"
    assert artifact_key("_") == f"ragen-run--{hashlib.sha256(b'_').hexdigest()[:12]}-metrics"


@pytest.mark.parametrize(("run_id", "suffix"), itertools.product(IDS, ["metrics", "comparison"]))
def test_prefect_accepts_every_key(run_id, suffix):
    key = artifact_key(run_id, suffix)
    assert ArtifactCreate(key=key, data="x").key == key
