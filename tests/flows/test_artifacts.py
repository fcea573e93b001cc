"""The iteration artifacts published in the background: every one lands, in order, and a failed one is not lost."""

from __future__ import annotations

import pytest


def _versions(key: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return sorted(a.description for a in found)


def test_each_iteration_lands_once_and_the_flow_waits_for_the_last(prefect_harness):
    from prefect import flow

    from tasks.reporting import IterationArtifacts

    @flow(name="artifacts-in-order")
    def publish_three() -> None:
        artifacts = IterationArtifacts()
        for iteration in range(3):
            artifacts.publish("bg-run", iteration, {"reward/mean": 0.5 * iteration})
        artifacts.wait()

    publish_three()
    assert _versions("ragen-bg-run-metrics") == [f"bg-run: metrics of iteration {i}" for i in range(3)]


def test_a_failed_publish_is_raised_at_the_next_one_or_dropped_when_already_failing(prefect_harness):
    from prefect import flow

    from tasks.reporting import IterationArtifacts

    @flow(name="artifacts-failing")
    def publish_bad(raise_error: bool) -> str:
        artifacts = IterationArtifacts()
        artifacts.publish("bad-run", 0, {"reward/mean": "not a number"})  # the markdown cannot format it
        if not raise_error:
            artifacts.wait(raise_error=False)
            return "quiet"
        artifacts.publish("bad-run", 1, {"reward/mean": 1.0})
        return "not reached"

    assert publish_bad(False) == "quiet"
    with pytest.raises(ValueError):
        publish_bad(True)
