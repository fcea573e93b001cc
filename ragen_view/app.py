"""The viewer's web app: FastAPI routes (:mod:`ragen_view.routes`) that render the pages of
:mod:`ragen_view.queries` with Jinja2 templates.

Read-only by construction: every route is a GET, every read goes through the lake's read-only query path (a user's
SQL filter in a process of its own, bounded in memory and time: :mod:`ragen_view.sandbox`), and the app writes nothing
anywhere. Every text from the lake (run ids, configs, replies, observations) reaches the page through Jinja2's
autoescaping, and the Content-Security-Policy runs no script and loads nothing from elsewhere, so a reply holding
``<script>`` is shown as text. Who may read it is :mod:`ragen_view.access`'s: a loopback Host when bound to loopback,
and the access token of the viewer's start (once in the URL, then a cookie).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from ragen_core.storage import DataLake
from ragen_core.storage.statements import one_line
from ragen_view import access, routes
from ragen_view.site import HERE, PageError, Site, environment

COLOURINGS = routes.COLOURINGS
COOKIE = access.COOKIE
is_loopback_host = access.is_loopback_host


def create_app(root: Path, token: str | None = None, loopback: bool = True, cookie: str = COOKIE) -> FastAPI:
    """The viewer of the data root ``root``. ``token``: every request must carry it (``ragen view`` makes one at
    each start; None: no token, for an app a test serves in its own process), once in the URL, then in the cookie
    ``cookie``; ``loopback``: only requests whose Host is a loopback name are served."""
    site = Site(DataLake(root), environment())
    app = FastAPI(title="RAGEN-Flows rollout viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.site = site
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.middleware("http")(access.guard(token, loopback, cookie))
    app.include_router(routes.router)

    @app.exception_handler(PageError)
    async def page_error(request: Request, exc: PageError) -> Response:
        return site.error(request, exc)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        """Anything else (a damaged file the checks did not name, a library's failure): one line, not a traceback,
        with the page's security headers (this handler answers outside the guard)."""
        message = f"{type(exc).__name__}: {one_line(str(exc)) or 'no message'}"
        return site.error(request, PageError(500, f"the page failed ({message})"))

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> Response:
        return site.error(request, PageError(404, f"no page at {request.url.path}"))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        errors = getattr(exc, "errors", lambda: [])()
        said = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:])}: {e.get('msg')}" for e in errors)
        return site.error(request, PageError(400, f"the address is not one of the viewer's: {said}"))

    return app
