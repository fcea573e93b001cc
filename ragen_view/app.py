"""The viewer's web app: FastAPI routes that render the pages of :mod:`ragen_view.queries` with Jinja2 templates.

Read-only by construction: every route is a GET, every read goes through the lake's read-only query path, and the
app writes nothing anywhere. Every text from the lake (run ids, configs, replies, observations) reaches the page
through Jinja2's autoescaping, and the Content-Security-Policy runs no script and loads nothing from elsewhere, so a
reply holding ``<script>`` is shown as text. Bound to a loopback address, only requests naming a loopback host are
served (a web page elsewhere cannot reach the viewer through DNS rebinding); bound elsewhere, every request needs the
access token (once in the URL, then a cookie).
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import duckdb
import jinja2
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from ragen_core.storage import DataLake, LakeError
from ragen_core.storage.names import is_valid_run_id
from ragen_core.storage.statements import one_line
from ragen_view import queries, render, tokens

HERE = Path(__file__).parent
COOKIE = "ragen_view_token"
COLOURINGS = {"mask": "loss mask", "logprob": "sampler log-prob", "advantage": "advantage"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class PageError(Exception):
    """A page that cannot be shown: its status and a message for the person who asked (shown escaped)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _number
    env.globals["query"] = lambda **values: urlencode({k: v for k, v in values.items() if v is not None}, doseq=True)
    return env


def _number(value: Any, digits: int = 4) -> str:
    """A number for a table cell: floats to ``digits`` significant digits, None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def create_app(root: Path, token: str | None = None, loopback: bool = True) -> FastAPI:
    """The viewer of the data root ``root``. ``token``: every request must carry it (bound beyond loopback);
    ``loopback``: only requests whose Host is a loopback name are served."""
    lake = DataLake(root)
    templates = _environment()
    app = FastAPI(title="RAGEN-Flows rollout viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def page(request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        body = templates.get_template(name).render(request=request, root=str(lake.root), **values)
        return HTMLResponse(body, status_code=status)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if loopback and not is_loopback_host(request.headers.get("host", "")):
            return _secured(HTMLResponse("<h1>403</h1><p>this viewer answers requests for 127.0.0.1 only</p>", 403))
        if token is not None:
            given = request.query_params.get("token")
            if given is not None and secrets.compare_digest(given.encode(), token.encode()):
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = "/" + request.url.path.lstrip("/") + (f"?{urlencode(rest)}" if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return _secured(response)
            if not secrets.compare_digest(request.cookies.get(COOKIE, "").encode(), token.encode()):
                return _secured(
                    HTMLResponse(
                        "<h1>403</h1><p>open the viewer with the URL <code>ragen view</code> printed (it holds the "
                        "access token)</p>",
                        403,
                    )
                )
        if request.method not in ("GET", "HEAD"):
            return _secured(HTMLResponse("<h1>405</h1><p>the viewer only reads</p>", 405))
        return _secured(await call_next(request))

    @app.exception_handler(PageError)
    async def page_error(request: Request, exc: PageError) -> Response:
        return page(request, "error.html", exc.status, message=str(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        """Anything else (a damaged file the checks above did not name, a library's failure): one line, not a
        traceback, with the page's security headers (this handler answers outside the guard)."""
        message = f"{type(exc).__name__}: {one_line(str(exc)) or 'no message'}"
        return _secured(page(request, "error.html", 500, message=f"the page failed ({message})"))

    def run_row(run_id: str) -> dict[str, Any]:
        if not is_valid_run_id(run_id):
            raise PageError(404, f"{run_id!r} is not a run id")
        return read("reading the run", queries.run, lake, run_id)

    def committed(run_id: str) -> list[int]:
        return read("reading the run's commits", lake.committed_iterations, run_id)

    def read(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``; a lake or query failure becomes the page's error (400 for a filter)."""
        try:
            return call(*args, **kwargs)
        except queries.NotFound as exc:
            raise PageError(404, str(exc)) from None
        except (LakeError, duckdb.Error, ValueError) as exc:
            raise PageError(400 if what == "the filter" else 500, f"{what} failed: {one_line(str(exc))}") from None

    @app.get("/", response_class=HTMLResponse)
    def runs_page(request: Request) -> HTMLResponse:
        rows = read("reading the runs", queries.runs, lake)
        return page(request, "runs.html", runs=rows)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, run_id: str, metric: list[str] = Query(default=[])) -> HTMLResponse:
        row = run_row(run_id)
        found = read("reading the curves", queries.curves, lake, [run_id], metric)
        charts = [render.chart(found.titles[m], m, found.series.get(m, {}), {run_id: 0}) for m in found.titles]
        return page(
            request,
            "run.html",
            run=row,
            charts=charts,
            config=queries.flat_config(row["config"]),
            iterations=read("reading the iterations", queries.iterations, lake, run_id),
            events=read("reading the events", queries.events, lake, run_id),
            metric_names=read("reading the metrics", queries.metric_names, lake, [run_id]),
            metric=metric,
        )

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(
        request: Request, run: list[str] = Query(default=[]), metric: list[str] = Query(default=[])
    ) -> HTMLResponse:
        run_ids = list(dict.fromkeys(run))
        if not run_ids:
            raise PageError(400, "pick one or more runs to compare (the boxes of the runs page)")
        rows = [run_row(r) for r in run_ids]
        colours = {r: i % render.SERIES_COLOURS for i, r in enumerate(run_ids)}
        found = read("reading the curves", queries.curves, lake, run_ids, metric)
        charts = [render.chart(found.titles[m], m, found.series.get(m, {}), colours) for m in found.titles]
        flat = [queries.flat_config(r["config"]) for r in rows]
        keys = sorted({k for f in flat for k in f if len({repr(g.get(k)) for g in flat}) > 1})
        diff = [(k, [f.get(k) for f in flat]) for k in keys]
        return page(
            request,
            "compare.html",
            runs=rows,
            colours=colours,
            charts=charts,
            diff=diff,
            metric_names=read("reading the metrics", queries.metric_names, lake, run_ids),
            metric=metric,
            hidden=[("run", r) for r in run_ids],
        )

    @app.get("/runs/{run_id}/iterations/{iteration}", response_class=HTMLResponse)
    def iteration_page(
        request: Request,
        run_id: str,
        iteration: int,
        split: str | None = None,
        env: str | None = None,
        success: str | None = None,
        truncated: str | None = None,
        kept: str | None = None,
        min_reward: str | None = None,
        max_reward: str | None = None,
        min_length: str | None = None,
        max_length: str | None = None,
        max_staleness: str | None = None,
        where: str | None = None,
        sort: str = "group",
        desc: int = 0,
        page_no: int = 0,
    ) -> HTMLResponse:
        row = run_row(run_id)
        filters = queries.Filters(
            split=split or None,
            env=env or None,
            success=_flag(success, "success"),
            truncated=_flag(truncated, "truncated"),
            kept=_flag(kept, "kept"),
            min_reward=_bound(min_reward, float, "min_reward"),
            max_reward=_bound(max_reward, float, "max_reward"),
            min_length=_bound(min_length, int, "min_length"),
            max_length=_bound(max_length, int, "max_length"),
            max_staleness=_bound(max_staleness, int, "max_staleness"),
            where=(where or "").strip() or None,
        )
        iterations = committed(run_id)
        if iteration not in iterations:
            raise PageError(404, f"run {run_id!r} has no committed iteration {iteration}")
        found = read("the filter", queries.trajectories, lake, run_id, iteration, filters, sort, bool(desc), page_no)
        return page(
            request,
            "iteration.html",
            run=row,
            iteration=iteration,
            page=found,
            filters=filters,
            groups=read("reading the groups", queries.groups, lake, run_id, iteration),
            envs=read("reading the envs", queries.envs, lake, run_id, iteration),
            sort=sort,
            desc=bool(desc),
            sorts=list(queries.SORTS),
            args=_args(request, exclude=("sort", "desc", "page_no")),
            committed=iterations,
        )

    @app.get("/runs/{run_id}/iterations/{iteration}/trajectory", response_class=HTMLResponse)
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
        row = run_row(run_id)
        if colour not in COLOURINGS:
            raise PageError(400, f"unknown colouring {colour!r}; one of: {', '.join(COLOURINGS)}")
        found, turns = read(
            "reading the trajectory", queries.trajectory, lake, run_id, iteration, split, env, group, traj
        )
        values, why, note = None, None, None
        if colour == "advantage":
            if split != "train":
                why = "validation rollouts are never trained on: they have no advantage"
            else:
                try:
                    values, note = tokens.advantages(
                        lake, run_id, iteration, row["config"], row["kind"], (group, traj)
                    )
                except tokens.AdvantageUnavailable as exc:
                    why = str(exc)
                except (LakeError, ValueError, KeyError, RuntimeError, OSError) as exc:
                    why = f"the advantage could not be recomputed: {one_line(str(exc))}"
        view = read("reading the trajectory's tokens", tokens.token_view, found, turns, row["model_dir"], values)
        others = []
        if split == "val":
            others = read(
                "reading the run's validations", queries.same_instance, lake, run_id, split, env, group, traj
            )
            others = [i for i in others if i != iteration]
        grids = {t.index: render.grid(env, (t.row or {}).get("observation")) for t in view.turns}
        return page(
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
            others=others,
            key={"split": split, "env": env, "group": group, "traj": traj},
        )

    @app.get("/seed", response_class=HTMLResponse)
    def seed_page(request: Request, env: str, seed: int) -> HTMLResponse:
        rows = read("reading the trajectories", queries.same_seed, lake, env, seed)
        return page(request, "seed.html", env=env, seed=seed, rows=rows)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> Response:
        return _secured(page(request, "error.html", 404, message=f"no page at {request.url.path}"))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        errors = getattr(exc, "errors", lambda: [])()
        said = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:])}: {e.get('msg')}" for e in errors)
        return _secured(page(request, "error.html", 400, message=f"the address is not one of the viewer's: {said}"))

    return app


def is_loopback_host(header: str) -> bool:
    """Whether a request's ``Host`` header names a loopback address (``localhost``, 127.0.0.0/8, ``[::1]``), with or
    without a port."""
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def _flag(value: str | None, name: str) -> bool | None:
    if value in (None, "", "any"):
        return None
    if value in ("yes", "true", "1"):
        return True
    if value in ("no", "false", "0"):
        return False
    raise PageError(400, f"{name} is yes, no or any, not {value!r}")


def _bound(value: str | None, kind: type, name: str) -> Any:
    if value in (None, ""):
        return None
    try:
        return kind(value)
    except ValueError:
        raise PageError(400, f"{name} must be a number, not {value!r}") from None


def _args(request: Request, exclude: tuple[str, ...]) -> dict[str, str]:
    """The request's query parameters but ``exclude``'s (a sort or page link keeps the filters)."""
    return {k: v for k, v in request.query_params.items() if k not in exclude and v != ""}
