"""Tools from an MCP server (``env.mcp``), against a real server process (tests/envs/mcp_calculator_server.py, written
with the mcp SDK's own server): its listing as the agent's tool schemas, its answers as results, its errors as the
agent's to read, a slow call as a timeout, a server that dies or cannot start as one line, and no process left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ragen_core.config import McpServerConfig
from ragen_core.envs import make_env
from ragen_core.envs.mcp_tools import (
    McpServerError,
    close_mcp_servers,
    hold_mcp_server,
    mcp_server,
    merged_tools,
    result_text,
    with_mcp_tools,
)
from ragen_core.envs.watchdog import Watchdog
from ragen_core.tools import Tool, ToolCall

SERVER = Path(__file__).resolve().with_name("mcp_calculator_server.py")
START_S = 60.0


def _server_config(tag: str, log: Path | None = None, extras: bool = True) -> McpServerConfig:
    command = [sys.executable, str(SERVER), tag, *(["--extras"] if extras else [])]
    return McpServerConfig(command=command, env={"MCP_CALL_LOG": str(log)} if log else {})


def _processes(tag: str) -> list[psutil.Process]:
    """The live processes whose command line holds ``tag`` (the server's own marker)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if tag in (process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def _result(env, tool: str, **arguments: object) -> str:
    """What the agent reads of a call of ``tool``."""
    return env.call(ToolCall(tool, arguments))[4]["tool_call"]["result"]


@pytest.fixture
def served(tmp_path):
    """A calculator env with the tools of a fresh server (its tag, its call log); the server stopped after."""
    tag, log = f"mcp-test-{uuid.uuid4().hex}", tmp_path / "calls.jsonl"
    env = with_mcp_tools(make_env("calculator"), _server_config(tag, log), 10.0, START_S)
    env.reset(0)
    yield env, tag, log
    close_mcp_servers()
    assert _processes(tag) == []


def test_the_server_s_listing_is_the_agent_s_tool_schemas(served):
    env, tag, _ = served
    assert len(_processes(tag)) == 1
    schemas = env.tool_schemas()
    # the env's calculate replaced in its place by the server's; answer stays the env's; the server's others follow
    assert [s["function"]["name"] for s in schemas] == ["calculate", "answer", "wait", "crash", "variable"]
    assert schemas[0] == {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression exactly (served over MCP).\n\nArgs:\n    expression: "
            "integers with + - * / and parentheses, e.g. (1200 + 34) * 2",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"title": "Expression", "type": "string"}},
                "required": ["expression"],
                "title": "calculateArguments",
            },
        },
    }
    assert schemas[1] == make_env("calculator").tool_schemas()[1]  # the env's own answer tool, unchanged
    assert schemas[2]["function"]["parameters"]["properties"] == {"seconds": {"title": "Seconds", "type": "number"}}


def test_merged_tools_replace_in_place_and_append_the_rest():
    def tool(name: str, origin: str) -> Tool:
        return Tool(name, origin, {"type": "object", "properties": {}}, lambda: origin)

    own = [tool("search", "env"), tool("answer", "env")]
    served = [tool("lookup", "mcp"), tool("search", "mcp")]
    merged = merged_tools(own, served)
    assert [(t.name, t.description) for t in merged] == [("search", "mcp"), ("answer", "env"), ("lookup", "mcp")]


def test_a_call_runs_on_the_server_and_its_text_is_the_result(served):
    env, _, log = served
    state, reward, done, _, info = env.call(ToolCall("calculate", {"expression": "(1200 + 34) * 2"}))
    assert info["tool_call"]["result"] == "2468" and info["tool_call"]["error"] is None
    assert (reward, done) == (0.0, False)
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"expression": "(1200 + 34) * 2", "result": "2468"}
    ]
    # the answer tool is still the env's: it ends the episode with the env's reward
    right = env.chain[-1]
    _, reward, done, _, info = env.call(ToolCall("answer", {"value": right}))
    assert (reward, done, info["success"]) == (1.0, True, True)


def test_an_error_the_server_answers_is_the_agent_s_to_read(served):
    env, _, log = served
    _, _, done, _, info = env.call(ToolCall("calculate", {"expression": "7 / (3 - 3)"}))
    record = info["tool_call"]
    assert record["error"] == "raised" and not done
    assert record["result"] == "error: calculate raised McpToolError: Error executing tool calculate: division by zero"
    assert info["action_is_valid"] and not info["action_is_effective"]
    # a call that does not fit the listed schema never reaches the server: the agent's format error
    _, _, _, _, info = env.call(ToolCall("calculate", {"expression": 12}))
    assert info["tool_call"]["error"] == "bad_arguments" and not info["action_is_valid"]
    # and the server goes on answering
    _, _, _, _, info = env.call(ToolCall("calculate", {"expression": "9 - 10"}))
    assert info["tool_call"]["result"] == "-1"
    assert len(log.read_text().splitlines()) == 2  # the division and the subtraction; the bad call never went


def test_a_tool_argument_may_have_any_name(served):
    """An argument called ``name`` (or ``server``, ``timeout_s``) reaches the tool, not the call's own parameters."""
    env, _, _ = served
    _, _, _, _, info = env.call(ToolCall("variable", {"name": "MCP_CALL_LOG"}))
    assert info["tool_call"]["error"] is None and info["tool_call"]["result"].endswith("calls.jsonl")


def test_pass_env_gives_the_server_the_run_s_variables_by_name_and_stores_no_value(monkeypatch):
    monkeypatch.setenv("RAGEN_MCP_TEST_TOKEN", "s3cret-value")
    tag = f"mcp-test-{uuid.uuid4().hex}"
    command = [sys.executable, str(SERVER), tag, "--extras"]
    config = McpServerConfig(command=command, pass_env=["RAGEN_MCP_TEST_TOKEN"], env={"PLAIN": "shown"})
    assert "s3cret-value" not in config.model_dump_json()  # the run's config holds the name only
    env = with_mcp_tools(make_env("calculator"), config, 10.0, START_S)
    env.reset(0)
    asked = {name: _result(env, "variable", name=name) for name in ("PLAIN", "RAGEN_MCP_TEST_TOKEN")}
    assert asked == {"PLAIN": "shown", "RAGEN_MCP_TEST_TOKEN": "s3cret-value"}
    bare = with_mcp_tools(make_env("calculator"), McpServerConfig(command=command), 10.0, START_S)
    bare.reset(0)  # without pass_env the variable stays the run's (the SDK passes a few of its own only)
    assert _result(bare, "variable", name="RAGEN_MCP_TEST_TOKEN") == "<unset>"
    close_mcp_servers()
    monkeypatch.delenv("RAGEN_MCP_TEST_TOKEN")
    with pytest.raises(McpServerError) as caught:  # a name not set: one line, before anything starts
        mcp_server(config, START_S)
    assert str(caught.value) == (
        f"the MCP server `{sys.executable} {SERVER} {tag} --extras` (env.mcp) could not start: env.mcp.pass_env names "
        "RAGEN_MCP_TEST_TOKEN, not set in this process's environment"
    )
    assert _processes(tag) == []


def test_a_session_stops_only_a_server_no_other_session_holds():
    """Two runs' sessions in one process (the Python API, a worker): the first to close leaves the server to the
    other, whose calls go on; the last one stops it; a later run's session starts it again."""
    tag = f"mcp-test-{uuid.uuid4().hex}"
    config = _server_config(tag)
    first, second = hold_mcp_server(config, START_S), hold_mcp_server(config, START_S)
    assert first.server is second.server and mcp_server(config, START_S) is first.server
    assert [s["function"]["name"] for s in first.tool_schemas()] == ["calculate", "wait", "crash", "variable"]
    env = with_mcp_tools(make_env("calculator"), config, 10.0, START_S)
    env.reset(0)
    first.release()
    first.release()  # idempotent: the other session's hold stays
    assert _result(env, "calculate", expression="6 * 7") == "42"
    second.release()
    assert _processes(tag) == []
    with pytest.raises(McpServerError, match="is gone: it was stopped"):
        env.call(ToolCall("calculate", {"expression": "1 + 1"}))
    later = hold_mcp_server(config, START_S)
    assert later.server is not first.server and len(_processes(tag)) == 1
    later.release()
    assert _processes(tag) == [] and hold_mcp_server(None, START_S) is None


def test_a_server_whose_loop_ended_stops_the_run(served):
    """A server whose loop ended without a failure said (``_ended``) is gone: the call stops the run."""
    env, _, _ = served
    server = mcp_server(_server_config(served[1], served[2]), START_S)
    server._ended.set()
    try:
        with pytest.raises(McpServerError, match="is gone: it was stopped"):
            env.call(ToolCall("calculate", {"expression": "1 + 1"}))
    finally:
        server._ended.clear()


def test_a_call_past_the_tool_timeout_is_a_timeout_and_the_server_goes_on(served):
    env, _, _ = served
    with Watchdog(0.5) as watchdog:
        _, _, done, _, info = env.call(ToolCall("wait", {"seconds": 3}), watchdog)
        assert info["tool_call"]["error"] == "timeout" and not done
        assert info["tool_call"]["result"] == "error: wait did not return within 0.5 s"
        _, _, _, _, info = env.call(ToolCall("calculate", {"expression": "2 * 21"}), watchdog)
    assert info["tool_call"]["result"] == "42"


def test_a_server_that_dies_stops_the_run_in_one_line_naming_it(served):
    env, tag, _ = served
    with Watchdog(10.0) as watchdog, pytest.raises(McpServerError) as caught:
        env.call(ToolCall("crash", {}), watchdog)
    message = str(caught.value)
    assert "\n" not in message
    assert f"the MCP server `{sys.executable} {SERVER} {tag} --extras` (env.mcp) is gone: it died" in message
    assert message.endswith("its last line on stderr: crash: exiting now")
    with pytest.raises(McpServerError, match="is gone: it died"):  # every later call too, never a hang
        env.call(ToolCall("calculate", {"expression": "1 + 1"}))
    assert _processes(tag) == []


def test_a_server_that_cannot_start_is_one_line_and_leaves_no_process():
    missing = McpServerConfig(command=["ragen-no-such-mcp-server", "--stdio"])
    with pytest.raises(McpServerError) as caught:
        mcp_server(missing, START_S)
    assert str(caught.value) == (
        "the MCP server `ragen-no-such-mcp-server --stdio` (env.mcp) could not start: FileNotFoundError: [Errno 2] "
        "No such file or directory: 'ragen-no-such-mcp-server'"
    )
    tag = f"mcp-test-{uuid.uuid4().hex}"
    exits = McpServerConfig(command=[sys.executable, "-c", "import sys; sys.exit('no tools today')", tag])
    with pytest.raises(McpServerError) as caught:
        mcp_server(exits, START_S)
    assert str(caught.value).endswith(
        "could not start: it exited before it answered; its last line on stderr: no tools today"
    )
    silent = McpServerConfig(command=[sys.executable, "-c", "import time; time.sleep(60)", tag])
    with pytest.raises(McpServerError, match=r"did not answer its start within 1 s \(env.user_code_timeout_s\)"):
        mcp_server(silent, 1.0)
    assert _processes(tag) == []


def test_an_env_without_tools_or_no_server_is_left_as_it_is():
    bandit = make_env("bandit")
    assert with_mcp_tools(bandit, _server_config("unused"), 10.0, START_S) is bandit
    calculator = make_env("calculator")
    assert with_mcp_tools(calculator, None, 10.0, START_S) is calculator
    assert "tools" not in vars(calculator)


def test_a_process_killed_outright_leaves_no_server(tmp_path):
    """The run's process killed with SIGKILL (no atexit, no close): the server reads the end of its stdin and exits."""
    tag = f"mcp-test-{uuid.uuid4().hex}"
    holder = (
        "import sys, time\n"
        "from ragen_core.config import McpServerConfig\n"
        "from ragen_core.envs.mcp_tools import mcp_server\n"
        f"mcp_server(McpServerConfig(command=[sys.executable, {str(SERVER)!r}, {tag!r}]), 60)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert process.stdout.readline().strip() == "ready"
        assert len(_processes(tag)) == 1
        process.kill()
        process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _processes(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes(tag) == []
    finally:
        process.kill()
        for left in _processes(tag):
            left.kill()


def test_the_result_the_agent_reads_is_the_answer_s_text():
    from mcp_types import CallToolResult, ImageContent, TextContent

    blocks = [TextContent(text="first"), ImageContent(data="AAAA", mime_type="image/png"), TextContent(text="last")]
    assert result_text(CallToolResult(content=blocks)) == "first\n[image content]\nlast"
    assert result_text(CallToolResult(content=[], structured_content={"rows": [1, 2]})) == '{"rows": [1, 2]}'
    assert result_text(CallToolResult(content=[])) == ""
