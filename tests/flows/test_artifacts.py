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


def test_free_text_reaches_the_logs_and_artifacts_as_one_escaped_line(prefect_harness):
    """Issue 39: a model path, a lock holder's command or an override holding a newline or an escape sequence reaches
    the flow run's logs (our loggers, a step's line) and a table artifact written out (``\\x0a``, ``\\x1b``), never
    as a second line or a screen command."""
    import json
    import logging
    import time

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId
    from prefect.context import get_run_context

    from flows import ui
    from tasks.reporting import publish_table_artifact

    hostile = "/models/a\nFAKE LINE\x1b[2J\x07"
    escaped = "/models/a\\x0aFAKE LINE\\x1b[2J\\x07"

    @flow(name="hostile-text")
    def hostile_run() -> str:
        with ui.showing("hostile-run", ["env:bandit"]):
            logging.getLogger("ragen.monitor").warning("loaded %s", hostile)
            ui.step(f"point 1 of 1: {hostile}")
            publish_table_artifact("ragen-hostile-comparison", [{"overrides": hostile, "n": 1}], f"about {hostile}")
        return str(get_run_context().flow_run.id)

    run_id = hostile_run()
    with get_client(sync_client=True) as client:
        for _ in range(50):  # the log sender works in the background
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            ours = [log.message for log in logs if "loaded" in log.message or "point 1" in log.message]
            if len(ours) == 2:
                break
            time.sleep(0.2)
        artifact = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ragen-hostile-comparison"]))
        )[0]
    assert sorted(ours) == sorted([f"loaded {escaped}", f"point 1 of 1: {escaped}"])
    assert all("\n" not in m and "\x1b" not in m for m in ours)
    assert json.loads(artifact.data) == [{"overrides": escaped, "n": 1}]  # the table's cells, as JSON text
    assert artifact.description == f"about {escaped}"
