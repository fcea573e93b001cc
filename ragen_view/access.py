"""Who may read the viewer: a request must name a loopback host when the viewer is bound to loopback (a web page
elsewhere cannot reach it through DNS rebinding), and must carry the access token that ``ragen view`` makes at each
start, on loopback too (another user of the machine can reach a loopback port), as Jupyter does.

The token comes once in the printed URL (``?token=...``); that visit gets a cookie (HttpOnly, SameSite=Strict, named
after the port so that two viewers of one browser keep theirs) and a redirect to the same address without the token,
so the token stays out of the history and of the links. Every later request carries the cookie. A request without
either is a 403 page that says how to get in.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ragen_view.site import secured

COOKIE = "ragen_view_token"
Middleware = Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]
NO_TOKEN = (
    "<p>Open it with the URL that <code>ragen view</code> printed when it started (it ends in "
    "<code>?token=</code> and a code): that visit leaves a cookie in this browser, and every link works from then "
    "on. Lost the URL? Stop the viewer (Ctrl-C) and start it again: each start prints a new one.</p>"
)


def cookie_name(port: int | None) -> str:
    """The cookie of the viewer on ``port`` (browsers send a host's cookies to all its ports: one name per port)."""
    return COOKIE if port is None else f"{COOKIE}_{port}"


def forbidden(title: str, text: str) -> Response:
    """A 403 page that shows nothing of the lake (not even the data root's path)."""
    body = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>403 · ragen view</title></head>'
        f'<body><h1 id="forbidden">{title}</h1>{text}</body></html>'
    )
    return secured(HTMLResponse(body, 403))


def guard(token: str | None, loopback: bool, cookie: str) -> Middleware:
    """The viewer's first step for every request: its Host (``loopback``), its token (``token``; None: none needed,
    as for an app a test serves in its own process), its method (the viewer only reads)."""

    async def check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if loopback and not is_loopback_host(request.headers.get("host", "")):
            return forbidden("This viewer answers requests for 127.0.0.1 only", "")
        if token is not None:
            given = request.query_params.get("token")
            if given is not None and secrets.compare_digest(given.encode(), token.encode()):
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = "/" + request.url.path.lstrip("/") + (f"?{urlencode(rest)}" if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(cookie, token, httponly=True, samesite="strict")
                return secured(response)
            if not secrets.compare_digest(request.cookies.get(cookie, "").encode(), token.encode()):
                if given is not None:
                    return forbidden("This token is not this viewer's (each start makes a new one)", NO_TOKEN)
                return forbidden("This viewer needs its access token", NO_TOKEN)
        if request.method not in ("GET", "HEAD"):
            return secured(HTMLResponse("<h1>405</h1><p>the viewer only reads</p>", 405))
        return secured(await call_next(request))

    return check


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
