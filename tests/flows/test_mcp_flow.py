"""A run whose agent's calculate tool is an MCP server's (``env.mcp``): the calculator config through `ragen train`
(a bootstrap on the scripted teacher's demonstrations, then two StarPO-S iterations, tiny sizes) with a real server
process (tests/envs/mcp_calculator_server.py, the mcp SDK's own server) started by the run. The turns' tool_calls
rows hold the server's answers (checked against the sums done here, and against the server's own log of its calls),
the run's config records the server (its pass_env's names, never their values), its manifest the server's tools (the
export's snippet shows them), and no server process outlives the run. Runs one after another in one process (the
Python API) each have the server, also while another run of the process holds it."""

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

from ragen_core.config import McpServerConfig
from ragen_core.envs import make_env
from ragen_core.envs.mcp_tools import hold_mcp_server, with_mcp_tools
from ragen_core.storage import DataLake, query
from ragen_core.tools import ToolCall

SERVER = Path(__file__).resolve().parents[1] / "envs" / "mcp_calculator_server.py"
SUM = re.compile(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*")

pytestmark = pytest.mark.process  # `ragen train` commands, each starting the MCP server it names


def _ragen(*args: str, timeout: float = 600, variables: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    dropped = {"PREFECT_HOME", "PREFECT_API_URL", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}
    dropped |= {"MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in dropped} | (variables or {})
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
    server = {"command": [sys.executable, str(SERVER), tag], "pass_env": ["MCP_CALL_LOG"]}  # its value: the run's
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
        "train",
        "--config",
        "configs/calculator.yaml",
        "--data-root",
        str(root),
        "--run-id",
        "mcp",
        *overrides,
        variables={"MCP_CALL_LOG": str(log)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, tag, log, server


def test_the_run_trains_two_iterations_and_records_the_server(mcp_run):
    root, _, log, server = mcp_run
    runs = query(root, "SELECT run_id, kind, status, config_json FROM runs ORDER BY kind").to_pylist()
    assert [(r["kind"], r["status"]) for r in runs] == [("bootstrap", "completed"), ("train", "completed")]
    for run in runs:
        assert json.loads(run["config_json"])["env"]["mcp"] == {**server, "env": {}, "cwd": None}
        assert str(log) not in run["config_json"]  # pass_env's value is the run's environment's, never stored
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


def test_the_manifest_records_the_server_s_tools_and_the_export_shows_them(mcp_run):
    root, tag, _, _ = mcp_run
    from ragen_core.run.chat import export_notes

    recorded = DataLake(root).read_manifest("mcp").mcp_tools
    assert [t["function"]["name"] for t in recorded] == ["calculate"]
    assert "served over MCP" in recorded[0]["function"]["description"]
    text = export_notes(DataLake(root), ["mcp"]).markdown
    tools = json.loads(re.search(r"^tools = (\[.*?^\])  #", text, re.M | re.S).group(1))
    # the rollouts' tools: the server's calculate in the env's in its place, the env's answer after it
    assert [t["function"]["name"] for t in tools] == ["calculate", "answer"] and tools[0] == recorded[0]
    assert tools[1] == make_env("calculator").tool_schemas()[1]
    lake, manifest = DataLake(root), DataLake(root).read_manifest("mcp")
    lake.write_manifest("mcp", manifest.without("mcp_tools"))  # a run that stopped before its session opened
    try:
        text = export_notes(lake, ["mcp"]).markdown
    finally:
        lake.write_manifest("mcp", manifest)
    assert f"Its agent also had the tools of the MCP server `{sys.executable} {SERVER} {tag}` (env.mcp)" in text
    assert not [p for p in psutil.process_iter(["cmdline"]) if tag in (p.info["cmdline"] or [])]  # none started


def test_runs_one_after_another_in_one_process_each_have_the_server(tmp_path, tiny_model_dir):
    """The Python API runs two runs in this process: the first stops its server at its end, the second starts it
    again; while another run of the process (a worker's) holds the server, a run's end leaves it to that run."""
    import ragen_core

    tag = f"mcp-api-{uuid.uuid4().hex}"
    config = McpServerConfig(command=[sys.executable, str(SERVER), tag])
    overrides = [
        f"model.path={tiny_model_dir}",
        f"env.mcp={config.model_dump_json()}",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=16",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=1",
        "eval.instances=2",
        "bootstrap.enabled=false",
        "trainer.num_threads=1",
    ]
    assert ragen_core.train("configs/calculator.yaml", tmp_path, "first", overrides).status == "completed"
    assert _live(tag) == []  # its session stopped the server it held
    other = hold_mcp_server(config, 60.0)  # another run of this process, still going
    env = with_mcp_tools(make_env("calculator"), config, 10.0, 60.0)
    env.reset(0)
    try:
        assert ragen_core.train("configs/calculator.yaml", tmp_path, "second", overrides).status == "completed"
        assert env.call(ToolCall("calculate", {"expression": "6 * 7"}))[4]["tool_call"]["result"] == "42"
    finally:
        other.release()
    assert _live(tag) == []


def _live(tag: str) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if tag in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
