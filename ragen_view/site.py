"""What every page of the viewer shares: the data root's lake, the templates, a page rendered with the security
headers, and a read of the lake whose failure becomes the page's one-line error (:class:`PageError`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import duckdb
import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from ragen_core.storage import DataLake, LakeError
from ragen_core.storage.names import is_valid_run_id
from ragen_core.storage.statements import one_line
from ragen_view import queries

HERE = Path(__file__).parent
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
FILTER = "the filter"  # what a read of the user's filter is called: its failure is the user's (400), not the lake's


class PageError(Exception):
    """A page that cannot be shown: its status and a message for the person who asked (shown escaped), and where
    its error page leads back to (``back``: a link and its words; the runs by default)."""

    def __init__(self, status: int, message: str, back: tuple[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.back = back or ("/", "back to the runs")


class BadParameter(PageError):
    """A 400 for a query parameter of the address (``names``: the parameters at fault, which the way back drops)."""

    def __init__(self, message: str, *names: str) -> None:
        super().__init__(400, message)
        self.names = names


def environment() -> jinja2.Environment:
    """The templates: every value escaped, an undefined name an error, ``num`` for table cells, ``query`` for links."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = number
    env.globals["query"] = lambda **values: urlencode({k: v for k, v in values.items() if v is not None}, doseq=True)
    return env


def number(value: Any, digits: int = 4) -> str:
    """A number for a table cell: floats to ``digits`` significant digits, None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def secured(response: Response) -> Response:
    """``response`` with the pages' security headers (no script, nothing from elsewhere, no caching)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


@dataclass
class Site:
    """The viewer of one data root: its lake and templates, shared by every route (``request.app.state.site``)."""

    lake: DataLake
    templates: jinja2.Environment

    def page(self, request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        body = self.templates.get_template(name).render(request=request, root=str(self.lake.root), **values)
        return HTMLResponse(body, status_code=status)

    def error(self, request: Request, exc: PageError) -> Response:
        """The error page of ``exc``: its message in one line and the way back."""
        href, words = exc.back
        return secured(self.page(request, "error.html", exc.status, message=str(exc), back=href, back_words=words))

    def read(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``; a lake or query failure becomes the page's error (400 for :data:`FILTER`)."""
        try:
            return call(*args, **kwargs)
        except queries.NotFound as exc:
            raise PageError(404, str(exc)) from None
        except (LakeError, duckdb.Error, ValueError) as exc:
            raise PageError(400 if what == FILTER else 500, f"{what} failed: {one_line(str(exc))}") from None

    def run_row(self, run_id: str) -> dict[str, Any]:
        if not is_valid_run_id(run_id):
            raise PageError(404, f"{run_id!r} is not a run id")
        return self.read("reading the run", queries.run, self.lake, run_id)

    def committed(self, run_id: str) -> list[int]:
        return self.read("reading the run's commits", self.lake.committed_iterations, run_id)


def site_of(request: Request) -> Site:
    return request.app.state.site
