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
(:class:`McpServer`), and the rollouts' threads hand it their calls. One server per process and config
(:func:`mcp_server`): a process forked from one starts its own. Each run's session holds the server of its config
(:func:`hold_mcp_server`) and lets it go when it closes (:meth:`McpHold.release`): the server stops when no session
of the process holds it any more, so runs one after another, or side by side, in one process (the Python API, a
worker) each have theirs; every server stops when the process exits (:func:`close_mcp_servers`), and a server whose
client died without stopping it reads the end of its stdin and exits (what MCP's stdio transport asks of it).

The server's environment is ``env.mcp.env`` (values stored in the run's config: nothing secret) and the variables
``env.mcp.pass_env`` names, read from this process's environment when the server starts and stored nowhere.
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
from operator import attrgetter
from typing import Any, TypeVar

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
T = TypeVar("T")


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
        self.config, self.pid, self.key = config, os.getpid(), config.model_dump_json()
        self.holders = 0  # the sessions that hold it (hold_mcp_server), counted under _SERVERS_LOCK
        self._environment = self._variables()  # before anything starts: a pass_env name not set is one line
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

    def _variables(self) -> dict[str, str] | None:
        """The server's own environment variables: ``env.mcp.pass_env``'s from this process's environment, then
        ``env.mcp.env``'s; None for none (the SDK's few inherited ones only)."""
        missing = [name for name in self.config.pass_env if name not in os.environ]
        if missing:
            raise McpServerError(
                f"{self.named()} could not start: env.mcp.pass_env names {', '.join(missing)}, not set in this "
                "process's environment"
            )
        return {**{name: os.environ[name] for name in self.config.pass_env}, **self.config.env} or None

    @property
    def is_gone(self) -> bool:
        """Whether the server died or was stopped (its loop ended, with or without a failure said)."""
        return self.failure is not None or self._ended.is_set()

    def stopped(self) -> McpServerError | None:
        """The error that stops the run when the server is gone (:meth:`gone`), else None: the tool env's failure
        hook, asked after each call."""
        return self.gone() if self.is_gone else None

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
            command=config.command[0], args=config.command[1:], env=self._environment, cwd=config.cwd
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
        if self.is_gone or self._loop is None:
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


_SERVERS: dict[str, McpServer] = {}  # by the config's JSON: one server per process and config
_SERVERS_LOCK = threading.Lock()


def mcp_server(config: McpServerConfig, start_timeout_s: float | None) -> McpServer:
    """The running server of ``config`` in this process, started (and its tools listed) at the first ask (the run's
    check; the rollouts then ask again). One that is gone is started again when no session holds it; one a session
    holds stays as it is, gone or not, until the session lets it go (its calls stop that run)."""
    with _SERVERS_LOCK:
        return _server(config, start_timeout_s, fresh=False)


def _server(config: McpServerConfig, start_timeout_s: float | None, fresh: bool) -> McpServer:
    """:func:`mcp_server` under ``_SERVERS_LOCK``; ``fresh``: a gone server is replaced even when held."""
    key = config.model_dump_json()
    server = _SERVERS.get(key)
    if server is not None and server.pid == os.getpid():  # a forked process starts its own
        if not server.is_gone or (server.holders and not fresh):
            return server
        if not server.holders:  # gone and held by no session: its thread and file let go
            server.close()
    server = _SERVERS[key] = McpServer(config, start_timeout_s)
    return server


class McpHold:
    """A run session's hold on the MCP server of its ``env.mcp`` (:func:`hold_mcp_server`): the server stays while
    any session of the process holds it; :meth:`release` lets it go, and stops it when no other session holds it."""

    def __init__(self, server: McpServer) -> None:
        self.server, self._released = server, False

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The schemas of the server's tools, as the rollouts give them to the agent (a run's manifest records them,
        for the export's snippet: :mod:`ragen_core.run.chat`)."""
        return [mcp_tool(self.server, listed, None).schema() for listed in self.server.listed]

    def release(self) -> None:
        """Let the server go (idempotent): stopped when no other session holds it."""
        with _SERVERS_LOCK:
            if self._released:
                return
            self._released, server = True, self.server
            server.holders -= 1
            if server.holders > 0:
                return
            if _SERVERS.get(server.key) is server:
                del _SERVERS[server.key]
        server.close()


def hold_mcp_server(config: McpServerConfig | None, start_timeout_s: float | None) -> McpHold | None:
    """A run session's hold on the running server of ``config`` (:func:`mcp_server`; one that is gone started
    again); None without a server (``env.mcp`` null)."""
    if config is None:
        return None
    with _SERVERS_LOCK:
        server = _server(config, start_timeout_s, fresh=True)
        server.holders += 1
        return McpHold(server)


def close_mcp_servers() -> None:
    """Stop every server this process started, held or not (the process's exit)."""
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


def _call_server(server: McpServer, tool: str, timeout_s: float | None, /, **arguments: Any) -> str:
    """A call of ``tool`` with ``arguments`` (of any names: ``name``, ``server`` and ``timeout_s`` too, the
    parameters before them being positional only)."""
    return server.call(tool, arguments, timeout_s)


def merged_tools(own: list[T], served: list[T], name: Callable[[T], str] = attrgetter("name")) -> list[T]:
    """The env's tools with the server's: one of an env tool's name in its place, the others after, in order
    (:class:`Tool` objects, or their schemas with ``name`` the function's name: :func:`schema_name`)."""
    by_name = {name(tool): tool for tool in served}
    merged = [by_name.pop(name(tool), tool) for tool in own]
    return [*merged, *(tool for tool in served if name(tool) in by_name)]


def schema_name(schema: dict[str, Any]) -> str:
    """The tool's name in its OpenAI function schema."""
    return schema["function"]["name"]


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
    env.use_tools(merged_tools(env.tools(), served), server.stopped)
    return env


__all__ = [
    "REQUEST_GRACE_S",
    "McpHold",
    "McpServer",
    "McpServerError",
    "McpToolError",
    "close_mcp_servers",
    "command_text",
    "hold_mcp_server",
    "mcp_server",
    "mcp_tool",
    "merged_tools",
    "result_text",
    "schema_name",
    "with_mcp_tools",
]
