"""Serving an environment over HTTP (``ragen env serve NAME``): any env of this project or of the user's own, as an
OpenEnv server that runs (``env.remote``) and OpenEnv's own clients play.

The routes are OpenEnv's: ``POST /reset`` (``{"seed", "episode_id"}``), ``POST /step`` (``{"action": {"action":
"Left"}, "episode_id", "step_index"}``), ``GET /state?episode_id=``, ``GET /health``, ``GET /metadata``, ``GET
/schema`` and the session socket ``/ws`` (``reset`` / ``step`` / ``state`` / ``close`` messages, one episode per
connection), each answer ``{"observation": {...}, "reward", "done"}``. Beyond them, ``GET /ragen/env`` says what is
served (and how many episodes it holds) and ``POST /ragen/call`` asks the calls that take an argument
(:mod:`ragen_core.envs.remote`); a reset may name the episodes its client is done with (``"release": [ids]``).

Every reset builds a fresh env under an episode id (:mod:`ragen_core.envs.episodes`), so many episodes run at once
(a run's ``env_groups x group_size``), each episode's calls one at a time in a worker thread, the episodes side by
side: a slow env holds up its own episode only. A step names its index: one sent again after a broken connection is
answered from its record, never applied twice. What the env raises or wrongly returns is answered with status 500
and the one line the run then stops with. A server bound to loopback answers only requests that name a loopback
host (``Host``), so that a web page elsewhere cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from ragen_core.envs.episodes import BAD_REQUEST, MAX_EPISODES, EnvServer, Refused, jsonable
from ragen_core.envs.external import shown


# The wire's shapes, as GET /schema shows them (OpenEnv's action / observation / state schemas)
class TextAction(BaseModel):
    """One action: a canonical action name, or the text a free-form env parses."""

    action: str = Field(description="The action, as the env's action_names spell it (or its free-form answer).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Ignored.")


class TextObservation(BaseModel):
    """What a reset or a step answers (the answer's ``observation``)."""

    text: str = Field(description="The env's state after the call (reset's or step's text).")
    info: dict[str, Any] = Field(description="The call's info (success, action_is_valid, action_is_effective, ...).")
    episode_id: str = Field(description="The episode: name it in each /step and /ragen/call.")
    seed: int = Field(description="The seed the episode was reset with.")
    step_index: int = Field(description="Steps the episode has taken.")
    env: str = Field(description="The served env's name.")
    server: str = Field(description="This start of the server (a new id at each start).")
    success: bool = Field(description="Whether the instance counts as solved.")
    terminated: bool = Field(description="The env ended the episode.")
    truncated: bool = Field(description="The env's own step limit cut the episode.")
    action_names: list[str] = Field(description="The env's action names.")
    render: str = Field(description="render(): the state as text.")
    describe: str | None = Field(description="describe(): the state in a sentence (null: the env has none).")
    end_reason: str | None = Field(description="end_reason(), once terminated.")
    instruction: str | None = Field(None, description="instruction(), after a reset.")
    brief: str | None = Field(None, description="brief(), after a reset.")
    map_key: str | None = Field(None, description="map_key(), after a reset of an env that holds out maps.")


class EpisodeState(BaseModel):
    """GET /state: an episode's id and steps (OpenEnv's State)."""

    episode_id: str | None = None
    step_count: int = 0


# -- the HTTP routes (Starlette's, imported when a server starts: a run that plays an env in process never does) ------


def _json(payload: Any, status: int = 200) -> Any:
    from starlette.responses import Response

    return Response(json.dumps(payload), status_code=status, media_type="application/json")


async def _body(request: Any) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise Refused(BAD_REQUEST, "the request's body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(BAD_REQUEST, "the request's body is not a JSON object")
    return body


def _field(body: dict[str, Any], key: str, kind: type, required: bool = False) -> Any:
    """``body[key]`` of type ``kind`` (None when absent and not ``required``); else :class:`Refused` (422)."""
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise Refused(BAD_REQUEST, f"{key} must be {kind.__name__}, got {shown(value, 40)}")
    if kind is int and value < 0:
        raise Refused(BAD_REQUEST, f"{key} must be at least 0, got {value}")
    return value


def _action(payload: Any) -> str:
    """The action text of an action payload (``{"action": "Left"}``)."""
    if not isinstance(payload, dict):
        raise Refused(BAD_REQUEST, 'an action is an object {"action": "<text>"}')
    return _field(payload, "action", str, required=True)


async def _answered(function: Callable[..., Any], *arguments: Any) -> Any:
    """``function(*arguments)`` in a worker thread, answered as JSON (a :class:`Refused` as its status and line)."""
    from starlette.concurrency import run_in_threadpool

    try:
        return _json(await run_in_threadpool(function, *arguments))
    except Refused as exc:
        return _json({"detail": exc.message}, exc.status)


async def _reset(request: Any) -> Any:
    try:
        body = await _body(request)
        arguments = (_field(body, "seed", int), _field(body, "episode_id", str), _released(body))
    except Refused as exc:
        return _json({"detail": exc.message}, exc.status)
    return await _answered(request.app.state.env.reset, *arguments)


def _released(body: dict[str, Any]) -> list[str]:
    """The episodes a reset names as done with (``"release": [ids]``; none when absent)."""
    released = _field(body, "release", list) or []
    if not all(isinstance(episode_id, str) for episode_id in released):
        raise Refused(BAD_REQUEST, f"release must be a list of episode ids, got {shown(released, 40)}")
    return released


async def _step(request: Any) -> Any:
    try:
        body = await _body(request)
        episode_id = _field(body, "episode_id", str, required=True)
        arguments = (episode_id, _action(body.get("action")), _field(body, "step_index", int))
    except Refused as exc:
        return _json({"detail": exc.message}, exc.status)
    return await _answered(request.app.state.env.step, *arguments)


async def _call(request: Any) -> Any:
    try:
        body = await _body(request)
        method = _field(body, "method", str, required=True)
        where = (_field(body, "episode_id", str), _field(body, "step_index", int))
    except Refused as exc:
        return _json({"detail": exc.message}, exc.status)
    return await _answered(request.app.state.env.call, method, body.get("argument"), *where)


async def _state(request: Any) -> Any:
    episode_id = request.query_params.get("episode_id")
    if not episode_id:
        return _json({"detail": "GET /state needs ?episode_id= (the id its /reset answered)"}, BAD_REQUEST)
    return await _answered(request.app.state.env.state, episode_id)


async def _facts(request: Any) -> Any:
    return _json(request.app.state.env.facts())


async def _health(request: Any) -> Any:
    return _json({"status": "healthy"})


async def _metadata(request: Any) -> Any:
    name = request.app.state.env.name
    description = f"{name}: a text environment of ragen-flows, one episode per reset (docs/environments.md)"
    fields = ("readme_content", "version", "author", "documentation_url")
    return _json({"name": name, "description": description, **dict.fromkeys(fields)})


async def _schema(request: Any) -> Any:
    models = {"action": TextAction, "observation": TextObservation, "state": EpisodeState}
    return _json({key: model.model_json_schema() for key, model in models.items()})


async def _session(websocket: Any) -> None:
    """``/ws``: one episode per connection, OpenEnv's messages (reset, step, state, close) until it closes."""
    from starlette.websockets import WebSocketDisconnect

    server: EnvServer = websocket.app.state.env
    episode_id = uuid.uuid4().hex
    await websocket.accept()
    try:
        while (reply := await _session_reply(server, episode_id, await websocket.receive_text())) is not None:
            await websocket.send_text(json.dumps(reply))
        await websocket.close()
    except WebSocketDisconnect:
        pass
    finally:
        server.drop(episode_id)


async def _session_reply(server: EnvServer, episode_id: str, text: str) -> dict[str, Any] | None:
    """The answer to one session message (None: ``close``)."""
    from starlette.concurrency import run_in_threadpool

    try:
        message = json.loads(text)
        kind, data = message.get("type"), message.get("data") or {}
        if not isinstance(data, dict):
            raise ValueError
    except (ValueError, AttributeError):
        message = 'a message is a JSON object {"type": ..., "data": {...}}'
        return {"type": "error", "data": {"message": message, "code": "INVALID_JSON"}}
    try:
        if kind == "reset":
            answer = await run_in_threadpool(server.reset, _field(data, "seed", int), episode_id)
        elif kind == "step":
            answer = await run_in_threadpool(server.step, episode_id, _action(data), None)
        elif kind == "state":
            return {"type": "state", "data": await run_in_threadpool(server.state, episode_id)}
        elif kind == "close":
            return None
        else:
            return {"type": "error", "data": {"message": f"unknown message type {kind!r}", "code": "UNKNOWN_TYPE"}}
    except Refused as exc:
        code = "VALIDATION_ERROR" if exc.status == BAD_REQUEST else "EXECUTION_ERROR"
        return {"type": "error", "data": {"message": exc.message, "code": code}}
    return {"type": "observation", "data": answer}


def create_app(server: EnvServer, allowed_host: Callable[[str], bool] | None = None) -> Any:
    """The server's ASGI app (Starlette): the routes above, over ``server``; with ``allowed_host``, a request whose
    ``Host`` it refuses is answered 403 (a socket refused), before any route."""
    from starlette.applications import Starlette
    from starlette.routing import Route, WebSocketRoute

    routes = [
        Route("/health", _health),
        Route("/metadata", _metadata),
        Route("/schema", _schema),
        Route("/ragen/env", _facts),
        Route("/reset", _reset, methods=["POST"]),
        Route("/step", _step, methods=["POST"]),
        Route("/state", _state),
        Route("/ragen/call", _call, methods=["POST"]),
        WebSocketRoute("/ws", _session),
    ]
    app = Starlette(routes=routes)
    app.state.env = server
    return app if allowed_host is None else _host_guard(app, allowed_host)


def _host_guard(app: Any, allowed_host: Callable[[str], bool]) -> Any:
    """``app`` behind a check of each request's ``Host`` header (``allowed_host``); its ``state`` is ``app``'s."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            host = dict(scope.get("headers") or ()).get(b"host", b"").decode("latin-1")
            if not allowed_host(host):
                if scope["type"] == "websocket":  # closed before it is accepted: the client is answered 403
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await _json({"detail": "this env server answers requests for a loopback host only"}, 403)(
                    scope, receive, send
                )
                return
        await app(scope, receive, send)

    guarded.state = app.state  # type: ignore[attr-defined]
    return guarded


def serve(server: EnvServer, sock: socket.socket, allowed_host: Callable[[str], bool] | None = None) -> None:
    """Serve ``server`` on the listening socket ``sock`` until Ctrl-C or SIGTERM (``allowed_host``: the ``Host``
    headers answered, :func:`create_app`)."""
    import uvicorn

    config = uvicorn.Config(
        create_app(server, allowed_host),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=75,  # a run's connection is kept between its turns (a client reconnects after anyway)
        timeout_graceful_shutdown=5,  # a session socket left open does not hold Ctrl-C up
    )
    uvicorn.Server(config).run(sockets=[sock])


__all__ = ["MAX_EPISODES", "EnvServer", "Refused", "TextAction", "TextObservation", "create_app", "jsonable", "serve"]
