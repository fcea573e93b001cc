"""The ``sweep`` flow: one run per point of a grid / random search, as deployment runs or local subflows.

Two doors onto one course (:func:`ragen_core.sweep.run_sweep`): :func:`sweep`, plain parameters (a
deployment's form), builds the request here, once; :func:`sweep_requested` runs a request its caller built (the
``ragen sweep`` command, ``ragen reproduce``)."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger

from flows import ui
from flows.train import train
from ragen_core.config import RunConfig
from ragen_core.monitor.reports import artifact_key
from ragen_core.sweep import DEFAULT_MAX_POINTS, SweepPoint, SweepRequest, run_sweep, sweep_request
from tasks import reporting as r
from tasks import sweep as sw

FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@ui.flow(name="sweep", flow_run_name=ui.named_after("sweep_id"), validate_parameters=False)
def sweep(
    config: RunConfig | dict[str, Any] | str | None = None,
    grid: list[str] | None = None,
    random: list[str] | None = None,
    samples: int = 0,
    seeds: int | str | list[int] | None = None,
    data_root: str = "data",
    sweep_id: str | None = None,
    overrides: list[str] | None = None,
    deployment: str | None = None,
    points: list[int] | None = None,
    search_seed: int = 0,
    poll_seconds: float = 2.0,
    max_points: int = DEFAULT_MAX_POINTS,
) -> dict[str, Any]:
    """plan (validate all points) -> run each point (``deployment`` runs, else local subflows) -> compare.

    Each point is its own run (id ``<sweep_id>-p<NNN>``) whose manifest records the sweep id, the point and its
    overrides. Running the same sweep again resumes it: completed points are skipped, failed ones resume. ``points``
    restricts the run to those indices (e.g. one failed point). ``deployment`` (e.g. ``train/train``) submits each
    point as a flow run of that deployment, so any worker of its pool can take it; the data root must then be
    reachable by the workers (pass an absolute path). A search of more than ``max_points`` points is refused.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    request = sweep_request(
        config,
        data_root,
        grid,
        random,
        samples,
        seeds,
        sweep_id,
        overrides,
        deployment,
        points,
        search_seed,
        poll_seconds,
        max_points,
    )
    return _sweep(request)


@ui.flow(name="sweep", flow_run_name=ui.named_after_request("request"), validate_parameters=False)
def sweep_requested(request: SweepRequest) -> dict[str, Any]:
    """The ``sweep`` flow of a request its caller built (its plan made, every point's config validated, once)."""
    return _sweep(request)


def _sweep(request: SweepRequest) -> dict[str, Any]:
    root = request.address  # a bucket's URL: each point's process opens its own copy
    chosen = request.chosen()

    def run_points(points: list[SweepPoint]) -> dict[str, str]:
        if request.deployment:
            return _run_deployments(request, points, root)
        return {p.run_id: _run_local(request, p, root, f"{n} of {len(chosen)}") for n, p in enumerate(points, 1)}

    tags = ui.run_tags(request.base.env.name, request.base.algorithm.preset, request.sweep_id)
    with ui.showing(request.sweep_id, tags):
        result = run_sweep(request, run_points, sw.record_sweep, sw.compare_sweep)
    description = f"Sweep {request.sweep_id}: validation success (before RL, last), final reward, collapse events"
    r.publish_table_artifact(artifact_key(request.sweep_id, "comparison"), result["points"], description)
    return result


def _run_local(request: SweepRequest, point: SweepPoint, root: str, count: str) -> str:
    """A point as a subflow of this sweep (a line as it starts and ends, ``count``: its place, "2 of 6"); a failing
    point is recorded and the sweep goes on."""
    started = time.monotonic()
    ui.step(f"point {count}: {point.run_id} · {' '.join(point.overrides) or '(base config)'}")
    state = train(
        point.config,
        data_root=root,
        run_id=point.run_id,
        sweep=point.manifest_entry(request.sweep_id),
        return_state=True,
    )
    ui.step(f"point {count}: {point.run_id} {state.type.value.lower()} in {time.monotonic() - started:.0f} s")
    if not state.is_completed():
        get_run_logger().warning(
            "sweep %s: point %d (%s) ended %s", request.sweep_id, point.index, point.run_id, state.type.value
        )
    return state.type.value


def _run_deployments(request: SweepRequest, chosen: list[SweepPoint], root: str) -> dict[str, str]:
    """Submit every point as a run of the request's deployment (linked to this flow run), then wait for all."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.runtime import flow_run as this_run

    submitted, since = {}, time.time()  # no attempt of this submission started before ``since``
    for point in chosen:
        # Prefect's client retries a request whose answer timed out (a busy server): without a key, a retried create
        # whose first attempt did land makes a second flow run of the point. One key per point and sweep flow run: a
        # retry gets the same flow run back, a later run of the sweep (a resume) submits anew.
        key = f"{this_run.id}:{point.run_id}"
        flow_run = run_deployment(
            request.deployment,
            parameters={
                "config": point.config.to_dict(),  # a deployment's parameters are plain data
                "data_root": root,
                "run_id": point.run_id,
                "sweep": point.manifest_entry(request.sweep_id),
            },
            flow_run_name=point.run_id,
            tags=[f"sweep:{request.sweep_id}"],
            idempotency_key=key,
            timeout=0,
        )
        submitted[point.run_id] = flow_run.id
    logger = get_run_logger()
    logger.info("sweep %s: submitted %d point(s) to %s", request.sweep_id, len(submitted), request.deployment)
    outcomes: dict[str, str] = {}
    with get_client(sync_client=True) as client:
        while len(outcomes) < len(submitted):
            for run_id, flow_run_id in submitted.items():
                if run_id in outcomes:
                    continue
                state = client.read_flow_run(flow_run_id).state
                if state is not None and state.type.value in FINAL_STATES:
                    outcomes[run_id] = state.type.value
                    ui.step(f"point {len(outcomes)} of {len(submitted)} done: {run_id} {state.type.value.lower()}")
                elif state is not None and state.type.value == "RUNNING" and _writer_lost(request, run_id, since):
                    _crashed(client, flow_run_id, run_id)
                    outcomes[run_id] = "CRASHED"
                    ui.step(
                        f"point {len(outcomes)} of {len(submitted)}: {run_id} lost its writer (its worker or host "
                        "died); running the sweep again resumes it"
                    )
            if len(outcomes) < len(submitted):
                time.sleep(request.poll_seconds)
    return outcomes


def _writer_lost(request: SweepRequest, run_id: str, since: float) -> bool:
    """Whether this submission's attempt at a point whose flow run is running is interrupted: its manifest, written
    since the submission (at ``since``: not an earlier attempt's, left ``running`` by an earlier loss), says
    ``running`` and no writer holds the run. The process that wrote it died with its worker or host, so its flow run
    will never end by itself. A writer on another machine holds the run until its lease expires (docs/lake.md, "One
    data root shared by several hosts")."""
    from datetime import datetime

    from ragen_core.storage.maintenance.housekeeping import interrupted_run

    manifest = request.lake.read_manifest(run_id)
    written = manifest.updated_at if manifest is not None else None
    if written is None or datetime.fromisoformat(written).timestamp() < int(since):  # stored to the second
        return False
    return interrupted_run(request.lake, run_id)


def _crashed(client: Any, flow_run_id: Any, run_id: str) -> None:
    """Mark a point's flow run crashed (its process is gone, and nothing else would end it)."""
    from prefect.states import Crashed

    message = f"run {run_id} lost its writer: its worker or host died; `ragen resume {run_id}` or the sweep resumes it"
    client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
