"""Tools from an MCP server (``env.mcp``): a Model Context Protocol server's tools as a tool env's tools.

The task stays the env's (its instruction, instances, reward and answer checking); the server supplies tools. The
server is a program (``env.mcp.command``) started once per process and spoken to over its stdin and stdout (MCP's
stdio transport, through the ``mcp`` SDK's client); each tool it lists becomes a :class:`~ragen_core.tools.Tool`
whose schema is the listing's name, description (a docstring's indentation dropped) and ``inputSchema`` as they are,
so the prompt shows the agent the server's own words. A tool of the name of one of the env's replaces it in place
(the env's other tools, the answer that ends the episode, stay; the replaced tool's own code no longer runs, so an
env whose state follows its tool's calls, as the calculator's expert counts its ``calculate`` results, loses that);
the others follow the env's, in the server's order.

A call runs on the server (``tools/call``) and its text content is the result the agent reads. What the server
answers as an error (``isError``, or a protocol error such as an unknown tool) is an error the agent reads, as a
tool that raised: ``error: <tool> raised McpToolError: ...``; a call past ``env.tool_timeout_s`` is abandoned like
any tool's (error ``timeout``, an events row), the client's wait for its answer ended a little later. A server that
cannot start (within ``env.user_code_timeout_s``) or that dies is no agent's error: the run stops with one line
naming the command and the server's last line on stderr (:class:`McpServerError`), the rest of which is kept in a
temporary file, not the run's terminal.

The MCP client is asynchronous: each server lives in a thread of its own with its own event loop
(:class:`McpServer`), and the rollouts' threads hand it their calls. One server per process and command
(:func:`mcp_server`): a process forked from one starts its own. It stops when the run's session closes
(:func:`close_mcp_servers`) or the process exits; a server whose client died without stopping it reads the end of its
stdin and exits (what MCP's stdio transport asks of it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import inspect
import json
import os
import shlex
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ragen_core.config import McpServerConfig
from ragen_core.envs.external import UserCodeError, one_line
from ragen_core.envs.tool_env import is_tool_env
from ragen_core.tools import Tool, ToolCall

# Seconds a request to the server may run beyond env.tool_timeout_s: the rollout's watchdog tells the agent of the
# timeout first (error "timeout"), then the client stops waiting for the answer and the thread that waited is let go.
REQUEST_GRACE_S = 5.0
# Seconds a stopping server is given, on top of the SDK's own bounded shutdown (stdin closed, then SIGTERM, SIGKILL).
STOP_WAIT_S = 10.0
STDERR_TAIL = 4096  # bytes of the server's stderr read for its last line


class McpServerError(UserCodeError):
    """The MCP server (``env.mcp``) could not start, did not answer in time, or died: one line naming its command;
    the run stops there."""


class McpToolError(Exception):
    """The MCP server answered a call with an error (the tool's ``isError`` result, or a protocol error): the
    agent reads it as the tool's error."""


def command_text(config: McpServerConfig) -> str:
    """The server's command as a shell would read it."""
    return shlex.join(config.command)


class McpServer:
    """One running MCP server (module docstring): its tools as listed at the start, and calls of them from any
    thread. Build it with :func:`mcp_server`."""

    def __init__(self, config: McpServerConfig, start_timeout_s: float | None) -> None:
        self.config, self.pid = config, os.getpid()
        self.listed: list[Any] = []  # the server's tools (mcp's Tool models), in its order
        self.failure: str | None = None  # why the server is gone, once it is
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self._ready, self._ended = threading.Event(), threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._thread = threading.Thread(target=self._serve, name="ragen-mcp-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout_s):
            said = self.said()
            self.close()
            limit = f"{start_timeout_s:g} s (env.user_code_timeout_s)"
            raise McpServerError(f"{self.named()} did not answer its start within {limit}{said}")
        if self.failure is not None:
            said = self.said()
            self.close()
            raise McpServerError(f"{self.named()} could not start: {self.failure}{said}")

    def named(self) -> str:
        """The server, as a message names it."""
        return f"the MCP server `{command_text(self.config)}` (env.mcp)"

    def gone(self) -> McpServerError:
        """The error of a server that is gone (it died, or was stopped)."""
        return McpServerError(f"{self.named()} is gone: {self.failure or 'it was stopped'}{self.said()}")

    def said(self) -> str:
        """The server's last line on stderr, as the end of a message (nothing when it wrote none)."""
        try:
            self._stderr.flush()
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - STDERR_TAIL))
            lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        except (OSError, ValueError):  # closed already
            return ""
        return f"; its last line on stderr: {lines[-1][:300]}" if lines else ""

    def _serve(self) -> None:
        try:
            asyncio.run(self._session())
        except asyncio.CancelledError:  # stopped before it answered its start (close)
            pass
        finally:
            self._ended.set()
            self._ready.set()

    async def _session(self) -> None:
        """The server's life: started, its tools listed, then held open until :meth:`close`."""
        from mcp import Client, StdioServerParameters, stdio_client

        self._loop, self._stop, self._task = asyncio.get_running_loop(), asyncio.Event(), asyncio.current_task()
        config = self.config
        parameters = StdioServerParameters(
            command=config.command[0], args=config.command[1:], env=dict(config.env) or None, cwd=config.cwd
        )
        try:  # the transport given as such, for the server's stderr to go to its file, not the run's terminal
            async with Client(stdio_client(parameters, errlog=self._stderr)) as client:
                self.listed = await _all_tools(client)
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # noqa: BLE001 - the server's failure, said in one line by the caller
            self.failure = _cause(exc)

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float | None) -> str:
        """The text of the server's answer to ``name(arguments)``; :class:`McpToolError` when it answers an error,
        :class:`McpServerError` when it is gone. The request is cancelled ``REQUEST_GRACE_S`` after ``timeout_s``
        (None: never)."""
        if self.failure is not None or self._ended.is_set() or self._loop is None:
            raise self.gone()
        limit = None if timeout_s is None else timeout_s + REQUEST_GRACE_S
        try:
            future = asyncio.run_coroutine_threadsafe(self._request(name, arguments, limit), self._loop)
        except RuntimeError:  # its loop ended since the check: the server is gone
            raise self.gone() from None
        try:
            return future.result(None if limit is None else limit + REQUEST_GRACE_S)
        except FutureTimeout:
            future.cancel()
            raise McpToolError(f"the MCP server did not answer within {limit:g} s") from None

    async def _request(self, name: str, arguments: dict[str, Any], limit: float | None) -> str:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            result = await self._client.call_tool(name, arguments, read_timeout_seconds=limit)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise McpToolError(exc.message) from None
            self.failure = f"it died (the connection closed during {ToolCall(name, arguments).text()})"
            raise self.gone() from None
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or "the server answered an error without a message")
        return text

    def close(self) -> None:
        """Stop the server (its stdin closed, then the SDK's SIGTERM and SIGKILL, each bounded) and its thread."""
        loop, started = self._loop, self._client is not None
        if loop is not None and not self._ended.is_set():
            with contextlib.suppress(RuntimeError):  # its loop ended meanwhile: what stopping wanted
                stop = self._stop.set if started and self._stop is not None else self._task.cancel
                loop.call_soon_threadsafe(stop)
        self._thread.join(STOP_WAIT_S)
        if self.failure is None:
            self.failure = "it was stopped"
        self._stderr.close()


async def _all_tools(client: Any) -> list[Any]:
    """Every tool the server lists, page after page."""
    listed, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return listed


def _cause(exc: BaseException) -> str:
    """One line for a failure of the server's start: the first leaf of the exception groups the SDK's task groups
    raise, by its type and message."""
    while getattr(exc, "exceptions", None):  # an exception group (anyio's task groups)
        exc = exc.exceptions[0]
    message = getattr(exc, "message", None)  # an MCPError's own words ("Connection closed": it exited)
    if isinstance(message, str) and message == "Connection closed":
        return "it exited before it answered"
    return one_line(exc)


def result_text(result: Any) -> str:
    """The text an agent reads of a call's result: its text blocks, one per line; any other block named by its
    type; the structured content as JSON when there is no block."""
    parts = [block.text if block.type == "text" else f"[{block.type} content]" for block in result.content]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


_SERVERS: dict[str, McpServer] = {}  # by the config's JSON: one server per process and command
_SERVERS_LOCK = threading.Lock()


def mcp_server(config: McpServerConfig, start_timeout_s: float | None) -> McpServer:
    """The running server of ``config`` in this process, started (and its tools listed) at the first ask; one that
    died is started again at the next run's ask (:func:`close_mcp_servers` forgets it)."""
    key = config.model_dump_json()
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None or server.pid != os.getpid():  # a forked process starts its own
            server = _SERVERS[key] = McpServer(config, start_timeout_s)
        return server


def close_mcp_servers() -> None:
    """Stop every server this process started (a run's end; the process's exit)."""
    with _SERVERS_LOCK:
        servers = [s for s in _SERVERS.values() if s.pid == os.getpid()]
        _SERVERS.clear()
    for server in servers:
        server.close()


atexit.register(close_mcp_servers)


def mcp_tool(server: McpServer, listed: Any, timeout_s: float | None) -> Tool:
    """The :class:`Tool` of one tool the server lists: its schema the listing's, its function a call of the server
    (within ``timeout_s``, ``env.tool_timeout_s``)."""
    description = inspect.cleandoc(listed.description or "") or listed.name  # a docstring's indent dropped
    function: Callable[..., str] = functools.partial(_call_server, server, listed.name, timeout_s)
    return Tool(listed.name, description, dict(listed.input_schema), function)


def _call_server(server: McpServer, name: str, timeout_s: float | None, **arguments: Any) -> str:
    return server.call(name, arguments, timeout_s)


def merged_tools(own: list[Tool], served: list[Tool]) -> list[Tool]:
    """The env's tools with the server's: one of an env tool's name in its place, the others after, in order."""
    by_name = {tool.name: tool for tool in served}
    merged = [by_name.pop(tool.name, tool) for tool in own]
    return [*merged, *(tool for tool in served if tool.name in by_name)]


def with_mcp_tools(
    env: Any, config: McpServerConfig | None, tool_timeout_s: float | None, start_timeout_s: float | None
) -> Any:
    """``env`` with the tools of the MCP server of ``config`` (``env.mcp``) joined to its own (module docstring);
    an env without tools, or no server (None), as it is. The env's ``tools()`` answers the merged list from then on,
    and a call that found the server dead stops the run (:class:`McpServerError`) rather than telling the agent."""
    if config is None or not is_tool_env(env):
        return env
    server = mcp_server(config, start_timeout_s)
    served = [mcp_tool(server, listed, tool_timeout_s) for listed in server.listed]
    env.use_tools(merged_tools(env.tools(), served), lambda: server.gone() if server.failure is not None else None)
    return env


__all__ = [
    "REQUEST_GRACE_S",
    "McpServer",
    "McpServerError",
    "McpToolError",
    "close_mcp_servers",
    "command_text",
    "mcp_server",
    "mcp_tool",
    "merged_tools",
    "result_text",
    "with_mcp_tools",
]
