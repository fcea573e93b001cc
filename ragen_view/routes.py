"""The viewer's pages, each a GET route that reads what it shows (:mod:`ragen_view.queries`) and renders its template:
the runs, a run, runs compared, an iteration, a trajectory, and the trajectories of one env seed."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from ragen_core.storage import LakeError
from ragen_core.storage.statements import one_line
from ragen_view import queries, render, tokens
from ragen_view.site import FILTER, BadParameter, PageError, site_of

COLOURINGS = {"mask": "loss mask", "logprob": "sampler log-prob", "advantage": "advantage"}
TRAJECTORIES = "trajectories"  # the iteration page's section of trajectories: its filter and links lead there

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request) -> HTMLResponse:
    site = site_of(request)
    return site.page(request, "runs.html", runs=site.read("reading the runs", queries.runs, site.lake))


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str, metric: list[str] = Query(default=[])) -> HTMLResponse:
    site = site_of(request)
    row = site.run_row(run_id)
    found = site.read("reading the curves", queries.curves, site.lake, [run_id], metric)
    charts = [render.chart(found.titles[m], m, found.series.get(m, {}), {run_id: 0}) for m in found.titles]
    return site.page(
        request,
        "run.html",
        run=row,
        charts=charts,
        config=queries.flat_config(row["config"]),
        iterations=site.read("reading the iterations", queries.iterations, site.lake, run_id),
        events=site.read("reading the events", queries.events, site.lake, run_id),
        metric_names=site.read("reading the metrics", queries.metric_names, site.lake, [run_id]),
        metric=metric,
    )


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, run: list[str] = Query(default=[]), metric: list[str] = Query(default=[])
) -> HTMLResponse:
    site = site_of(request)
    run_ids = list(dict.fromkeys(run))
    if not run_ids:
        raise PageError(400, "pick one or more runs to compare (the boxes of the runs page)")
    rows = [site.run_row(r) for r in run_ids]
    colours = {r: i % render.SERIES_COLOURS for i, r in enumerate(run_ids)}
    found = site.read("reading the curves", queries.curves, site.lake, run_ids, metric)
    charts = [render.chart(found.titles[m], m, found.series.get(m, {}), colours) for m in found.titles]
    flat = [queries.flat_config(r["config"]) for r in rows]
    keys = sorted({k for f in flat for k in f if len({repr(g.get(k)) for g in flat}) > 1})
    return site.page(
        request,
        "compare.html",
        runs=rows,
        colours=colours,
        charts=charts,
        diff=[(k, [f.get(k) for f in flat]) for k in keys],
        metric_names=site.read("reading the metrics", queries.metric_names, site.lake, run_ids),
        metric=metric,
        hidden=[("run", r) for r in run_ids],
    )


@router.get("/runs/{run_id}/iterations/{iteration}", response_class=HTMLResponse)
def iteration_page(
    request: Request, run_id: str, iteration: int, sort: str = "group", desc: int = 0, page_no: int = 0
) -> HTMLResponse:
    """An iteration's groups and one page of its trajectories under the filters of the address (each a query
    parameter: :func:`_filters`). A bad parameter, or a filter DuckDB cannot run, is an error page that leads back
    to the iteration without it."""
    site = site_of(request)
    row = site.run_row(run_id)
    iterations = site.committed(run_id)
    if iteration not in iterations:
        raise PageError(404, f"run {run_id!r} has no committed iteration {iteration}")
    try:
        filters = _filters(request)
        if sort not in queries.SORTS:
            raise BadParameter(f"unknown sort {sort!r}; sort by one of: {', '.join(queries.SORTS)}", "sort", "desc")
        try:
            found = site.read(
                FILTER, queries.trajectories, site.lake, run_id, iteration, filters, sort, bool(desc), page_no
            )
        except PageError as exc:
            raise BadParameter(f"{exc}; the filter was: {filters.where}", "where", "page_no") from None
    except BadParameter as exc:
        said = "the SQL filter" if exc.names[0] == "where" else exc.names[0]
        exc.back = (_without(request, exc.names), f"back to iteration {iteration}, without {said}")
        raise
    return site.page(
        request,
        "iteration.html",
        run=row,
        iteration=iteration,
        page=found,
        filters=filters,
        groups=site.read("reading the groups", queries.groups, site.lake, run_id, iteration),
        envs=site.read("reading the envs", queries.envs, site.lake, run_id, iteration),
        sort=sort,
        desc=bool(desc),
        args=_args(request, exclude=("sort", "desc", "page_no")),
        committed=iterations,
        section=TRAJECTORIES,
    )


def _filters(request: Request) -> queries.Filters:
    """The iteration page's filters from the address's query parameters (an empty one: no filter)."""
    given = {k: v for k, v in request.query_params.items() if v != ""}
    return queries.Filters(
        split=given.get("split"),
        env=given.get("env"),
        success=_flag(given.get("success"), "success"),
        truncated=_flag(given.get("truncated"), "truncated"),
        kept=_flag(given.get("kept"), "kept"),
        min_reward=_bound(given.get("min_reward"), float, "min_reward"),
        max_reward=_bound(given.get("max_reward"), float, "max_reward"),
        min_length=_bound(given.get("min_length"), int, "min_length"),
        max_length=_bound(given.get("max_length"), int, "max_length"),
        max_staleness=_bound(given.get("max_staleness"), int, "max_staleness"),
        where=(given.get("where") or "").strip() or None,
    )


def _without(request: Request, names: tuple[str, ...]) -> str:
    """The address of the request's page without the query parameters ``names``, at its trajectories."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in names and v != ""]
    return request.url.path + (f"?{urlencode(kept)}" if kept else "") + f"#{TRAJECTORIES}"


@router.get("/runs/{run_id}/iterations/{iteration}/trajectory", response_class=HTMLResponse)
def trajectory_page(
    request: Request,
    run_id: str,
    iteration: int,
    split: str,
    env: str,
    group: int,
    traj: int,
    colour: str = "mask",
) -> HTMLResponse:
    site = site_of(request)
    row = site.run_row(run_id)
    if colour not in COLOURINGS:
        raise PageError(400, f"unknown colouring {colour!r}; one of: {', '.join(COLOURINGS)}")
    found, turns = site.read(
        "reading the trajectory", queries.trajectory, site.lake, run_id, iteration, split, env, group, traj
    )
    values, why, note = None, None, None
    if colour == "advantage":
        values, why, note = _advantages(site.lake, row, iteration, split, (group, traj))
    view = site.read("reading the trajectory's tokens", tokens.token_view, found, turns, row["model_dir"], values)
    others = []
    if split == "val":
        others = site.read(
            "reading the run's validations", queries.same_instance, site.lake, run_id, split, env, group, traj
        )
        others = [i for i in others if i != iteration]
    legend = render.legend_of(env)
    grids = {t.index: render.grid(legend, (t.row or {}).get("observation")) for t in view.turns}
    return site.page(
        request,
        "trajectory.html",
        run=row,
        iteration=iteration,
        row=found,
        view=view,
        turns=turns,
        colour=colour,
        colourings=COLOURINGS,
        advantage_missing=why,
        advantage_note=note,
        grids=grids,
        final_grid=render.grid(legend, found.get("final_state")),
        others=others,
        key={"split": split, "env": env, "group": group, "traj": traj},
    )


def _advantages(
    lake: Any, row: dict[str, Any], iteration: int, split: str, key: tuple[int, int]
) -> tuple[list[float] | None, str | None, str | None]:
    """The trajectory's per-token advantages and a note on them, or why there are none."""
    if split != "train":
        return None, "validation rollouts are never trained on: they have no advantage", None
    try:
        values, note = tokens.advantages(lake, row["run_id"], iteration, row["config"], row["kind"], key)
    except tokens.AdvantageUnavailable as exc:
        return None, str(exc), None
    except (LakeError, ValueError, KeyError, RuntimeError, OSError) as exc:
        return None, f"the advantage could not be recomputed: {one_line(str(exc))}", None
    return values, None, note


@router.get("/seed", response_class=HTMLResponse)
def seed_page(request: Request, env: str, seed: int) -> HTMLResponse:
    site = site_of(request)
    rows = site.read("reading the trajectories", queries.same_seed, site.lake, env, seed)
    return site.page(request, "seed.html", env=env, seed=seed, rows=rows)


def _flag(value: str | None, name: str) -> bool | None:
    if value in (None, "any"):
        return None
    if value in ("yes", "true", "1"):
        return True
    if value in ("no", "false", "0"):
        return False
    raise BadParameter(f"{name} is yes, no or any, not {value!r}", name)


def _bound(value: str | None, kind: type, name: str) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        raise BadParameter(f"{name} must be a number, not {value!r}", name) from None


def _args(request: Request, exclude: tuple[str, ...]) -> dict[str, str]:
    """The request's query parameters but ``exclude``'s (a sort or page link keeps the filters)."""
    return {k: v for k, v in request.query_params.items() if k not in exclude and v != ""}
