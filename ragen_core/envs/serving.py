"""Serving an environment over HTTP (``ragen env serve NAME``): any env of this project or of the user's own, as an
OpenEnv server that runs (``env.remote``) and OpenEnv's own clients play.

The routes are OpenEnv's: ``POST /reset`` (``{"seed", "episode_id"}``), ``POST /step`` (``{"action": {"action":
"Left"}, "episode_id", "step_index"}``), ``GET /state?episode_id=``, ``GET /health``, ``GET /metadata``, ``GET
/schema`` and the session socket ``/ws`` (``reset`` / ``step`` / ``state`` / ``close`` messages, one episode per
connection), each answer ``{"observation": {...}, "reward", "done"}``. Beyond them, ``GET /ragen/env`` says what is
served and ``POST /ragen/call`` asks the calls that take an argument (:mod:`ragen_core.envs.remote`).

Every reset builds a fresh env (:func:`~ragen_core.envs.base.make_env` with the served options) under an episode
id, so many episodes run at once (a run's ``env_groups x group_size``); the least recently used beyond
:data:`MAX_EPISODES` is let go, and a client rebuilds it. A step names its index: one sent again after a broken
connection is answered from its record, never applied twice. The env's calls are served one at a time, as the
rollouts call an env in process, and what the env raises or wrongly returns is answered with status 500 and the one
line the run then stops with.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ragen_core.envs.base import TextEnv, env_factory, make_env
from ragen_core.envs.external import UserCodeError, env_reset, env_source, env_step, one_line, shown
from ragen_core.envs.remote import CONFLICT, GONE, OPTIONAL_METHODS, PROTOCOL
from ragen_core.envs.tool_env import is_tool_env

MAX_EPISODES = 16_384  # episodes held at once (each an env instance); the least recently used beyond is let go
BAD_REQUEST = 422


class Refused(Exception):
    """A request answered with an error ``status`` and one line (``message``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, " ".join(message.split())


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


def jsonable(value: Any) -> Any:
    """``value`` as JSON's types: numpy's numbers as Python's, tuples as lists, keys as text, anything else as its
    text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    return str(value)


@dataclass
class Episode:
    """One episode: its env, its seed, the steps it took and the last step's action and answer."""

    env: TextEnv
    seed: int
    steps: int = 0
    last: tuple[str, dict[str, Any]] | None = None


def _generator(state: Any) -> np.random.Generator:
    """The numpy generator in ``state`` (a bit generator's ``state`` dict), for the served env's sample_action."""
    kinds = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM, "Philox": np.random.Philox}
    kinds.update(SFC64=np.random.SFC64, MT19937=np.random.MT19937)
    kind = kinds.get(state.get("bit_generator")) if isinstance(state, dict) else None
    if kind is None:
        raise Refused(BAD_REQUEST, f"sample_action takes a numpy bit generator's state ({', '.join(kinds)})")
    bit_generator = kind()
    try:
        bit_generator.state = state
    except (TypeError, ValueError, KeyError) as exc:
        raise Refused(BAD_REQUEST, f"sample_action: not a {state['bit_generator']} state: {one_line(exc)}") from None
    return np.random.Generator(bit_generator)


# The calls POST /ragen/call answers: a method of the env, given the request's argument
CALLS: dict[str, Callable[[TextEnv, Any], Any]] = {
    "teacher_actions": lambda env, argument: env.teacher_actions(int(argument)),
    "expert_plan": lambda env, argument: list(env.expert_plan(int(argument))),
    "parse_action": lambda env, argument: env.parse_action(str(argument)),
    "reward_bounds": lambda env, argument: list(env.reward_bounds(int(argument))),
    "success_from_reward": lambda env, argument: env.success_from_reward(float(argument)),
    "end_reason": lambda env, argument: env.end_reason(),
    "describe": lambda env, argument: env.describe(),
}


class EnvServer:
    """The episodes of env ``name`` built with ``options`` (module docstring); its calls served one at a time."""

    def __init__(self, name: str, options: dict[str, Any] | None = None, capacity: int = MAX_EPISODES) -> None:
        factory = env_factory(name, "ragen env serve")  # a ValueError of one line: unknown, or not importable
        self.name, self.options, self.capacity = name, dict(options or {}), capacity
        try:  # the options checked once, before serving (a fresh env answers reward_bounds too)
            self.probe = make_env(name, **self.options)
        except ValueError:
            raise
        except Exception as exc:  # the env's own constructor raised: one line, never a traceback
            raise ValueError(f"environment {name!r} raised when built: {one_line(exc)}") from None
        if is_tool_env(self.probe):  # its tools' schemas and calls are not on the wire: the client would play text
            raise ValueError(f"{name} is a tool env, played in the run's process only: train it without env.remote")
        self.server = uuid.uuid4().hex
        self.methods = [m for m in OPTIONAL_METHODS if getattr(type(self.probe), m) is not getattr(TextEnv, m)]
        self.source = env_source(name, factory).to_dict()
        self._episodes: OrderedDict[str, Episode] = OrderedDict()
        self._lock = threading.Lock()

    def facts(self) -> dict[str, Any]:
        """``GET /ragen/env``: what this server serves."""
        return {
            "protocol": PROTOCOL,
            "server": self.server,
            "env": self.name,
            "options": jsonable(self.options),
            "held_out_maps": bool(self.probe.held_out_maps),
            "methods": self.methods,
            "source": self.source,
        }

    def _guarded(self, called: str, function: Callable[[], Any]) -> Any:
        """``function()``; what the env raises is :class:`Refused` (500) naming the env and ``called``."""
        try:
            return function()
        except UserCodeError as exc:
            raise Refused(500, str(exc)) from None
        except Exception as exc:  # the env's own error, said in one line to the client, which stops its run with it
            raise Refused(500, f"environment {self.name} {called} raised {one_line(exc)}") from None

    def reset(self, seed: int | None, episode_id: str | None) -> dict[str, Any]:
        """A fresh env reset with ``seed`` (None: one drawn) as episode ``episode_id`` (None: a new id)."""
        seed = secrets.randbelow(2**32) if seed is None else seed
        episode_id = episode_id or uuid.uuid4().hex
        with self._lock:
            env = self._guarded("when built", lambda: make_env(self.name, **self.options))
            text, info = self._guarded(f"reset({seed})", lambda: env_reset(env, seed))
            episode = Episode(env, seed)
            self._episodes[episode_id] = episode
            self._episodes.move_to_end(episode_id)
            while len(self._episodes) > self.capacity:
                self._episodes.popitem(last=False)
            return self._guarded(f"after reset({seed})", lambda: self._answer(episode_id, episode, text, info))

    def step(self, episode_id: str, action: str, step_index: int | None) -> dict[str, Any]:
        """``action`` applied to the episode, once: a step sent again (its index and action) answers from its
        record; another index than the episode's is refused (409)."""
        with self._lock:
            episode = self._episode(episode_id)
            if step_index is not None and step_index != episode.steps:
                if step_index == episode.steps - 1 and episode.last is not None and episode.last[0] == action:
                    return episode.last[1]
                raise Refused(CONFLICT, f"episode {episode_id} is at step_index {episode.steps}, not {step_index}")
            called = f"step({shown(action, 40)})"
            text, reward, terminated, truncated, info = self._guarded(called, lambda: env_step(episode.env, action))
            episode.steps += 1
            answer = self._guarded(
                f"after {called}",
                lambda: self._answer(episode_id, episode, text, info, float(reward), terminated, truncated),
            )
            episode.last = (action, answer)
            return answer

    def call(self, method: str, argument: Any, episode_id: str | None, step_index: int | None) -> dict[str, Any]:
        """``POST /ragen/call``: ``method(argument)`` of the episode's env (None: of a fresh env, for answers that
        depend on no state), or sample_action with the generator state ``argument`` (answered with its new state)."""
        if method not in CALLS and method != "sample_action":
            raise Refused(BAD_REQUEST, f"unknown call {method!r}; known: {', '.join([*CALLS, 'sample_action'])}")
        with self._lock:
            episode = None if episode_id is None else self._episode(episode_id)
            if episode is not None and step_index is not None and step_index != episode.steps:
                raise Refused(CONFLICT, f"episode {episode_id} is at step_index {episode.steps}, not {step_index}")
            env = self.probe if episode is None else episode.env
            called = f"{method}({shown(argument, 40)})"
            if method == "sample_action":
                rng = _generator(argument)
                value = self._guarded(called, lambda: env.sample_action(rng))
                return {"value": jsonable(value), "rng": rng.bit_generator.state}
            return {"value": jsonable(self._guarded(called, lambda: CALLS[method](env, argument)))}

    def state(self, episode_id: str) -> dict[str, Any]:
        """``GET /state``: the episode's id and steps."""
        with self._lock:
            return {"episode_id": episode_id, "step_count": self._episode(episode_id).steps}

    def drop(self, episode_id: str) -> None:
        """Let the episode go (its session closed)."""
        with self._lock:
            self._episodes.pop(episode_id, None)

    def _episode(self, episode_id: str) -> Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise Refused(GONE, f"no episode {episode_id!r} on this server (it started again, or let it go)")
        self._episodes.move_to_end(episode_id)
        return episode

    def _answer(
        self,
        episode_id: str,
        episode: Episode,
        text: str,
        info: dict[str, Any],
        reward: float | None = None,
        terminated: bool = False,
        truncated: bool = False,
    ) -> dict[str, Any]:
        """The answer of a reset (``reward`` None) or a step: the observation with the state's facts."""
        env = episode.env
        observation = {
            "text": text,
            "info": jsonable(info),
            "episode_id": episode_id,
            "seed": episode.seed,
            "step_index": episode.steps,
            "env": self.name,
            "server": self.server,
            "success": bool(env.success),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "action_names": list(env.action_names),
            "render": env.render(),
            "describe": env.describe() if "describe" in self.methods else None,
            "end_reason": str(env.end_reason()) if terminated else None,
        }
        if reward is None:
            held_out = bool(env.held_out_maps)
            observation.update(instruction=env.instruction(), brief=env.brief(), map_key=None)
            observation["map_key"] = env.map_key() if held_out else None
        return {"observation": observation, "reward": reward, "done": bool(terminated or truncated)}


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
        arguments = (_field(body, "seed", int), _field(body, "episode_id", str))
    except Refused as exc:
        return _json({"detail": exc.message}, exc.status)
    return await _answered(request.app.state.env.reset, *arguments)


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
            return {"type": "state", "data": server.state(episode_id)}
        elif kind == "close":
            return None
        else:
            return {"type": "error", "data": {"message": f"unknown message type {kind!r}", "code": "UNKNOWN_TYPE"}}
    except Refused as exc:
        code = "VALIDATION_ERROR" if exc.status == BAD_REQUEST else "EXECUTION_ERROR"
        return {"type": "error", "data": {"message": exc.message, "code": code}}
    return {"type": "observation", "data": answer}


def create_app(server: EnvServer) -> Any:
    """The server's ASGI app (Starlette): the routes above, over ``server``."""
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
    return app


def serve(server: EnvServer, sock: socket.socket) -> None:
    """Serve ``server`` on the listening socket ``sock`` until Ctrl-C or SIGTERM."""
    import uvicorn

    config = uvicorn.Config(
        create_app(server),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=75,  # a run's connection is kept between its turns (a client reconnects after anyway)
        timeout_graceful_shutdown=5,  # a session socket left open does not hold Ctrl-C up
    )
    uvicorn.Server(config).run(sockets=[sock])


__all__ = ["MAX_EPISODES", "EnvServer", "Refused", "TextAction", "TextObservation", "create_app", "jsonable", "serve"]
