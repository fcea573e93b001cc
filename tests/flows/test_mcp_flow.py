"""A run whose agent's calculate tool is an MCP server's (``env.mcp``): the calculator config through `ragen train`
(a bootstrap on the scripted teacher's demonstrations, then two StarPO-S iterations, tiny sizes) with a real server
process (tests/envs/mcp_calculator_server.py, the mcp SDK's own server) started by the run. The turns' tool_calls
rows hold the server's answers (checked against the sums done here, and against the server's own log of its calls),
the run's config records the server, and no server process outlives the run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pytest

from ragen_core.storage import query

SERVER = Path(__file__).resolve().parents[1] / "envs" / "mcp_calculator_server.py"
SUM = re.compile(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*")


def _ragen(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    dropped = {"PREFECT_HOME", "PREFECT_API_URL", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}
    dropped |= {"MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _by_hand(expression: str) -> str | None:
    """``a op b`` computed here (None for any other expression): what the server must have answered."""
    found = SUM.fullmatch(expression)
    if found is None:
        return None
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


@pytest.fixture(scope="module")
def mcp_run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("mcp")
    tag, log = f"mcp-flow-{uuid.uuid4().hex}", root / "server_calls.jsonl"
    server = {"command": [sys.executable, str(SERVER), tag], "env": {"MCP_CALL_LOG": str(log)}}
    overrides = [
        f"model.path={tiny_model_dir}",
        f"env.mcp={json.dumps(server)}",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=2",
        "eval.every=1",
        "eval.instances=2",
        "bootstrap.num_groups=4",
        "bootstrap.epochs=1",
        "bootstrap.batch_size=4",
        "trainer.num_threads=1",
    ]
    result = _ragen(
        "train", "--config", "configs/calculator.yaml", "--data-root", str(root), "--run-id", "mcp", *overrides
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, tag, log, server


def test_the_run_trains_two_iterations_and_records_the_server(mcp_run):
    root, _, _, server = mcp_run
    runs = query(root, "SELECT run_id, kind, status, config_json FROM runs ORDER BY kind").to_pylist()
    assert [(r["kind"], r["status"]) for r in runs] == [("bootstrap", "completed"), ("train", "completed")]
    for run in runs:
        assert json.loads(run["config_json"])["env"]["mcp"] == {**server, "cwd": None}
    iterations = query(root, "SELECT DISTINCT iteration FROM turns WHERE run_id = 'mcp' AND split = 'train'")
    assert sorted(iterations.column("iteration").to_pylist()) == [0, 1]


def test_the_tool_calls_rows_are_the_server_s_answers(mcp_run):
    root, _, log, _ = mcp_run
    rows = query(root, "SELECT tool_calls FROM turns WHERE tool_calls IS NOT NULL").column("tool_calls").to_pylist()
    calls = [call for row in rows for call in row if call["name"] == "calculate" and call["error"] is None]
    answered = Counter((json.loads(c["arguments"])["expression"], c["result"]) for c in calls)
    logged = Counter((c["expression"], c["result"]) for c in map(json.loads, log.read_text().splitlines()))
    assert answered and not answered - logged  # every answer the agent read, the server gave (its log)
    checked = [(expression, result) for expression, result in answered if _by_hand(expression) is not None]
    assert checked  # the teacher's demonstrations at least write a op b
    assert all(result == _by_hand(expression) for expression, result in checked)
    # the env's own calculate never ran: its work (shown in render) stays empty, so every answer came from the server
    states = query(root, "SELECT final_state FROM trajectories").column("final_state").to_pylist()
    assert not any("calculate(" in (state or "") for state in states)


def test_no_server_process_outlives_the_run(mcp_run):
    _, tag, _, _ = mcp_run
    left = [p for p in psutil.process_iter(["cmdline", "status"]) if tag in (p.info["cmdline"] or [])]
    assert [p for p in left if p.info["status"] != psutil.STATUS_ZOMBIE] == []
