"""Env servers as users start them: ``ragen env serve NAME`` (the installed command) in a process of its own, its
output in a log file, its URL read from what it printed; stopped by its PID."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def serve(name: str, log: Path, *args: str, port: int = 0, env: dict | None = None, timeout: float = 120.0):
    """``ragen env serve NAME --port PORT [args]`` started in its own session, writing to ``log``; returns (the
    process, the URL it printed). A server that prints no URL within ``timeout`` s is killed (RuntimeError with its
    output)."""
    script = str(Path(sys.executable).with_name("ragen"))
    command = [script, "env", "serve", name, "--port", str(port), *args]
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if match := re.search(r"ragen env serve: (http://\S+)", log.read_text()):
            return process, match.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    stop(process, signal.SIGKILL)
    raise RuntimeError(f"ragen env serve {name} printed no URL: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to the server by its PID and reap it (SIGKILL after 20 s); its exit status."""
    try:
        os.kill(process.pid, sig)
    except ProcessLookupError:
        pass
    try:
        return process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        return process.wait(timeout=20)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])
