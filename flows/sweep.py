"""The ``sweep`` flow: one run per point of a grid / random search, as deployment runs or local subflows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger

from flows import ui
from flows.train import resolve_config, train
from ragen_core.config import RunConfig
from ragen_core.monitor.reports import artifact_key
from ragen_core.storage import DataLake
from ragen_core.storage.names import validate_run_id
from ragen_core.sweep import DEFAULT_MAX_POINTS, SweepPlan, SweepPoint
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
    plan: SweepPlan | None = None,
) -> dict[str, Any]:
    """plan (validate all points) -> run each point (``deployment`` runs, else local subflows) -> compare.

    Each point is its own run (id ``<sweep_id>-p<NNN>``) whose manifest records the sweep id, the point and its
    overrides. Running the same sweep again resumes it: completed points are skipped, failed ones resume. ``points``
    restricts the run to those indices (e.g. one failed point). ``deployment`` (e.g. ``train/train``) submits each
    point as a flow run of that deployment, so any worker of its pool can take it; the data root must then be
    reachable by the workers (pass an absolute path). A search of more than ``max_points`` points is refused.

    A config is validated once: ``config`` as a tree (a deployment's parameter) here, a :class:`RunConfig` (what the
    CLI passes) not again; ``plan``, a plan the caller already made of ``config`` (the CLI, ``ragen reproduce``), is
    recorded and run as it is (the search parameters then only name the flow run), its points' configs handed on.
    """
    ui.escape_stored_parameters()  # a run created elsewhere: its stored texts escaped first
    if sweep_id is not None:
        validate_run_id(sweep_id, "sweep id")  # it prefixes the points' run ids: a name, never a pattern or a path
    base = resolve_config(config, overrides)
    lake = DataLake(data_root)
    if plan is None:
        plan = sw.plan_sweep(lake, base, list(grid or []), list(random or []), samples, seeds, sweep_id, search_seed,
                             max_points)  # fmt: skip
    else:
        sw.record_sweep(lake, plan)
    chosen = [p for p in plan.points if points is None or p.index in set(points)]
    root = str(Path(data_root).resolve())
    with ui.showing(plan.sweep_id, ui.run_tags(base.env.name, base.algorithm.preset, plan.sweep_id)):
        if deployment:
            outcomes = _run_deployments(plan, chosen, deployment, root, poll_seconds)
        else:
            outcomes = {p.run_id: _run_local(plan, p, root, f"{n} of {len(chosen)}") for n, p in enumerate(chosen, 1)}
        rows = sw.compare_sweep(lake, plan)
    for row in rows:
        row["outcome"] = outcomes.get(row["run_id"], "not run")
        if row["status"] == "pending" and row["outcome"] != "not run":
            row["status"] = REMOVED  # it ran here, but its run is gone: removed (`ragen runs rm`) since
    description = f"Sweep {plan.sweep_id}: validation success (before RL, last), final reward, collapse events"
    r.publish_table_artifact(artifact_key(plan.sweep_id, "comparison"), rows, description)
    return {"sweep_id": plan.sweep_id, "data_root": root, "points": rows}


REMOVED = "removed"  # a point's status when it ran in this sweep but its run is gone from the data root


def _run_local(plan: SweepPlan, point: SweepPoint, root: str, count: str) -> str:
    """A point as a subflow of this sweep (a line as it starts and ends, ``count``: its place, "2 of 6"); a failing
    point is recorded and the sweep goes on."""
    started = time.monotonic()
    ui.step(f"point {count}: {point.run_id} · {' '.join(point.overrides) or '(base config)'}")
    state = train(point.config, data_root=root, run_id=point.run_id, sweep=point.manifest_entry(plan.sweep_id),
                  return_state=True)  # fmt: skip
    ui.step(f"point {count}: {point.run_id} {state.type.value.lower()} in {time.monotonic() - started:.0f} s")
    if not state.is_completed():
        get_run_logger().warning("sweep %s: point %d (%s) ended %s", plan.sweep_id, point.index, point.run_id,
                                 state.type.value)  # fmt: skip
    return state.type.value


def _run_deployments(
    plan: SweepPlan, chosen: list[SweepPoint], deployment: str, root: str, poll_seconds: float
) -> dict[str, str]:
    """Submit every point as a run of ``deployment`` (linked to this flow run), then wait for all of them."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.runtime import flow_run as this_run

    submitted = {}
    for point in chosen:
        # Prefect's client retries a request whose answer timed out (a busy server): without a key, a retried create
        # whose first attempt did land makes a second flow run of the point. One key per point and sweep flow run: a
        # retry gets the same flow run back, a later run of the sweep (a resume) submits anew.
        key = f"{this_run.id}:{point.run_id}"
        flow_run = run_deployment(
            deployment,
            parameters={
                "config": point.config.to_dict(),  # a deployment's parameters are plain data
                "data_root": root,
                "run_id": point.run_id,
                "sweep": point.manifest_entry(plan.sweep_id),
            },
            flow_run_name=point.run_id,
            tags=[f"sweep:{plan.sweep_id}"],
            idempotency_key=key,
            timeout=0,
        )
        submitted[point.run_id] = flow_run.id
    logger = get_run_logger()
    logger.info("sweep %s: submitted %d point(s) to %s", plan.sweep_id, len(submitted), deployment)
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
            if len(outcomes) < len(submitted):
                time.sleep(poll_seconds)
    return outcomes
