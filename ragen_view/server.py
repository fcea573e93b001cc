"""``ragen view``'s server: the viewer app (:func:`ragen_view.app.create_app`) under uvicorn, on a socket bound here
first, so that a port in use or a host that is no address of this machine is a one-line error before anything runs,
and port 0 (any free port) prints the port it got."""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import webbrowser
from dataclasses import dataclass
from pathlib import Path


class ViewError(Exception):
    """The viewer cannot start (the message says why and what to pass instead)."""


@dataclass
class Binding:
    """The bound socket and its port, its URL (holding the access token of this start), the token, and whether it
    is loopback."""

    sock: socket.socket
    url: str
    token: str
    loopback: bool
    port: int


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) is a loopback address; another name is refused."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise ViewError(
            f"--host must be an IP address of this machine (127.0.0.1, 0.0.0.0, ...), not {host!r}"
        ) from None


def bind(host: str, port: int) -> Binding:
    """A listening socket on ``host``:``port`` (0: any free port) and a fresh access token, on loopback too: another
    user of this machine can reach a loopback port."""
    if not 0 <= port <= 65535:
        raise ViewError(f"--port must be 0-65535 (0: any free port), not {port}")
    loopback = is_loopback(host)
    address = "127.0.0.1" if host == "localhost" else host
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        if exc.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
            raise ViewError(f"port {port} on {address} is in use: pass --port N (0: any free port)") from None
        raise ViewError(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    bound = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    shown = f"[{address}]" if family == socket.AF_INET6 else address
    if not loopback and address in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    return Binding(sock, f"http://{shown}:{bound}/?token={token}", token, loopback, bound)


def has_display() -> bool:
    """Whether a browser window can open here (a desktop session); a headless machine only prints the URL."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def serve(root: Path, binding: Binding, open_browser: bool) -> None:
    """Serve the viewer of ``root`` on ``binding`` until Ctrl-C or SIGTERM."""
    import uvicorn

    from ragen_view.access import cookie_name
    from ragen_view.app import create_app

    app = create_app(root, token=binding.token, loopback=binding.loopback, cookie=cookie_name(binding.port))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    if open_browser:
        threading.Timer(0.5, webbrowser.open, args=(binding.url,)).start()
    server.run(sockets=[binding.sock])


def spawn(root: Path, *args: str, cwd: Path | None = None, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """``ragen view --data-root ROOT --port 0 --no-open [args]`` started as a user starts it, in a process of its own
    (its output on its ``stdout`` pipe), and the URL it printed; the process is killed when no URL came within
    ``timeout`` seconds (a RuntimeError with its output). Stop it with SIGINT (Ctrl-C)."""
    command = [sys.executable, "-m", "ragen_cli.main", "view", "--data-root", str(root), "--port", "0", "--no-open"]
    process = subprocess.Popen(
        [*command, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline, line = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if match := re.search(r"(http://\S+)", line):
            return process, match.group(1)
        if process.poll() is not None:
            break
    process.kill()
    raise RuntimeError(f"ragen view did not print its URL: {line!r} {process.stdout.read()[-2000:]}")
