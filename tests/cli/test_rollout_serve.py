"""`ragen rollout serve` refuses what cannot serve in one line, before it starts anything, and stops on SIGTERM
leaving nothing behind (the runs that use such a server: tests/flows/test_vllm_servers.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from tests.vllm_env import require_vllm_python

TOKEN = "serve-test-token-0123456789"


@pytest.mark.parametrize(
    ("args", "token", "needle"),
    [
        (["--model", "{model}"], "", "RAGEN_ROLLOUT_TOKEN is not set"),
        (["--model", "{model}"], "short", "RAGEN_ROLLOUT_TOKEN is shorter than 16 characters"),
        (["--model", "{missing}"], TOKEN, "is no model folder (no config.json in it)"),
        (["--model", "{model}", "--dtype", "fp32"], TOKEN, "--dtype must be one of float32, bfloat16, float16"),
        (["--model", "{model}", "--max-lora-rank", "4"], TOKEN, "--max-lora-rank must be one of 1, 8, 16"),
        (["--model", "{model}", "--max-loras", "0"], TOKEN, "--max-loras must be at least 1"),
        (["--model", "{model}", "--port", "70000"], TOKEN, "--port must be 0-65535"),
    ],
)
def test_a_server_that_cannot_be_is_one_line_and_starts_nothing(
    args, token, needle, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("RAGEN_ROLLOUT_TOKEN", token)
    monkeypatch.setenv("RAGEN_VLLM_PYTHON", sys.executable)  # no vLLM needed: nothing may start
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("a refused server was started"))
    filled = [a.format(model=tiny_model_dir, missing=tmp_path / "none") for a in args]
    result = CliRunner().invoke(app, ["rollout", "serve", *filled])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def test_a_port_in_use_is_one_line(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("RAGEN_ROLLOUT_TOKEN", TOKEN)
    monkeypatch.setenv("RAGEN_VLLM_PYTHON", sys.executable)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("a refused server was started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["rollout", "serve", "--model", str(tiny_model_dir), "--port", str(port)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: port {port} on 127.0.0.1 is in use: pass --port N (0: any free port)"


@pytest.mark.vllm
@pytest.mark.process
def test_sigterm_stops_the_server_and_nothing_is_left(tiny_model_dir, tmp_path):
    """The documented way to stop a server started on its own: it answers /health as ready (with the settings a run
    checks) until SIGTERM, then exits 0 with its engine."""
    require_vllm_python()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("ragen")), "rollout", "serve", "--model", str(tiny_model_dir)]
            + ["--port", str(port), "--enforce-eager", "--dtype", "bfloat16"],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RAGEN_ROLLOUT_TOKEN": TOKEN},
            start_new_session=True,
        )
    try:
        deadline, health = time.monotonic() + 300, {}
        while health.get("state") != "ready":
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    health = json.loads(answer.read())
            except OSError:
                pass
        assert health["pid"] == process.pid  # the command became the server (exec): its signals are the server's
        assert health["dtype"] == "bfloat16" and health["max_lora_rank"] is None
        assert log.read_text().startswith(f"ragen rollout serve: http://127.0.0.1:{port}  (")
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        with pytest.raises(ProcessLookupError):  # nothing of its process group (the engine's) is left
            os.killpg(process.pid, 0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
