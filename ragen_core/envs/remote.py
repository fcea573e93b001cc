"""An environment played on an env server (``env.remote``): a :class:`~ragen_core.envs.base.TextEnv` whose every
call goes over HTTP to the server that ``ragen env serve NAME`` starts (:mod:`ragen_core.envs.serving`).

The wire is OpenEnv's protocol (``POST /reset``, ``POST /step``, ``GET /state``, ``/health``, ``/schema``; the
observation is a JSON object) with what the rollouts need carried in it: the state's text, ``success``,
``terminated`` / ``truncated``, the action names, ``render()``, ``describe()``, ``end_reason()`` once terminated, and
after a reset the ``instruction()``, ``brief()`` and ``map_key()``. What takes an argument (``reward_bounds(n)``, the
teacher's and the expert's moves, ``parse_action``, ``sample_action``) is asked with ``POST /ragen/call``, and what
the served env defines beyond the protocol's minimum is said once by ``GET /ragen/env``: the client's class then
defines exactly those methods (:func:`remote_class`), so what the run asks of an env's class (a teacher, a
description) has the served class's answer.

Every episode has an id (a fresh one per reset) and every step its index, so no call is ever applied twice: a call
whose connection broke is sent again at once and then for a few seconds (:data:`RETRY_DELAYS`: a server restarting),
a step the server had applied answers from its record, and an episode the server no longer holds (it restarted, or
let the episode go) is rebuilt from its seed and the actions it took, then checked against the state it had. The
episode a client is done with (it resets again, is closed or is garbage) is named to the server at the next reset
there (``"release"``), so the server holds about the episodes being played, not every one a run ever played. A call
that gets no answer within the run's ``env.user_code_timeout_s``, a server still unreachable after the retries, or an
env that raised on the server stops the run in one line (:class:`RemoteEnvError`) naming the server and the call;
the run is ``failed`` at its last commit and ``ragen resume`` continues it once the server is back.
"""

from __future__ import annotations

import functools
import http.client
import json
import threading
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ragen_core.envs.base import StepResult, TextEnv, make_env
from ragen_core.envs.external import UserCodeError, one_line, shown

PROTOCOL = 1  # the version of what /ragen/env and the observations carry beyond OpenEnv's protocol
# Waits before each try of a call whose connection failed: a kept-alive connection the server closed is tried again
# at once, a server that refuses connections (restarting) for about 4 s fails the call.
RETRY_DELAYS = (0.0, 0.25, 0.5, 1.0, 2.0)
GONE, CONFLICT = 410, 409  # the server's statuses for an episode it does not hold, and a step index it did not expect
# The methods of TextEnv that a served env may define beyond the protocol's minimum (GET /ragen/env says which)
OPTIONAL_METHODS = (
    "teacher_actions",
    "describe",
    "expert_plan",
    "parse_action",
    "sample_action",
    "success_from_reward",
    "end_reason",
)


class RemoteEnvError(UserCodeError):
    """A call of an env server failed: no answer in time, unreachable after the retries, or refused (the served env
    raised, or the server does not serve what the run plays). One line naming the server and the call; the run
    stops there, as for any env's error."""


class _EpisodeGone(Exception):
    """The server does not hold the episode (it restarted, or let the episode go): rebuild it and ask again."""


_CONNECTIONS = threading.local()  # one kept-alive connection per server per thread


def _connection(url: str) -> http.client.HTTPConnection:
    pool: dict[str, http.client.HTTPConnection] = _CONNECTIONS.__dict__.setdefault("pool", {})
    if url not in pool:
        parts = urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        pool[url] = kind(parts.hostname, parts.port)
    return pool[url]


def _drop(url: str) -> None:
    connection = _CONNECTIONS.__dict__.get("pool", {}).pop(url, None)
    if connection is not None:
        connection.close()


def request(url: str, method: str, path: str, body: Any, timeout_s: float | None, where: str = "") -> Any:
    """The JSON answer of ``method path`` on the server at ``url``. A broken or refused connection is tried again
    (:data:`RETRY_DELAYS`); no answer within ``timeout_s`` (None: no limit), a server unreachable after the tries or
    an error status is a :class:`RemoteEnvError` naming the server, the call and ``where`` (the episode)."""
    payload = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    started, failure = time.monotonic(), ""
    for delay in RETRY_DELAYS:
        time.sleep(delay)
        connection = _connection(url)
        connection.timeout = timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(timeout_s)
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            status, data = response.status, response.read()
        except TimeoutError:
            _drop(url)
            raise RemoteEnvError(
                f"the env server {url} did not answer {method} {path} within {timeout_s:g} s{where}: it may hang; "
                "if it only needs longer, raise env.user_code_timeout_s"
            ) from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, closed: nothing was answered
            _drop(url)
            failure = one_line(exc)
            continue
        return _answer(url, f"{method} {path}", status, data, where)
    raise RemoteEnvError(
        f"the env server {url} is unreachable on {method} {path}{where} ({failure}; {len(RETRY_DELAYS)} tries in "
        f"{time.monotonic() - started:.1f} s): is it running? start it (`ragen env serve ...`); a run it stopped "
        "goes on with `ragen resume`"
    )


def _answer(url: str, call: str, status: int, data: bytes, where: str) -> Any:
    """The JSON of a 200 answer; an episode the server does not hold is :class:`_EpisodeGone`; any other status a
    :class:`RemoteEnvError` with the server's own words (its ``detail``)."""
    try:
        answer = json.loads(data) if data else None
    except ValueError:
        answer = None
    if status == 200 and answer is not None:
        return answer
    if status == GONE:
        raise _EpisodeGone
    detail = answer.get("detail") if isinstance(answer, dict) else None
    said = " ".join(detail.split())[:300] if isinstance(detail, str) else shown(detail or data, 300)
    raise RemoteEnvError(f"the env server {url} answered {call}{where} with status {status}: {said}")


@dataclass(frozen=True)
class ServedEnv:
    """What a server says it serves (``GET /ragen/env``): its id (new at each start), the env's name and options,
    whether it holds out maps, the optional methods it defines and where its code comes from."""

    url: str
    server: str
    name: str
    options: dict[str, Any]
    held_out_maps: bool
    methods: frozenset[str]
    source: dict[str, Any]

    def same_env(self, other: ServedEnv) -> bool:
        """Whether ``other`` serves the same env (another start of the server, say)."""
        keep = ("name", "options", "held_out_maps", "methods")
        return all(getattr(self, k) == getattr(other, k) for k in keep)


_SERVED: dict[str, ServedEnv] = {}  # by URL: asked once, again when an answer comes from another start


def served_env(url: str, timeout_s: float | None, fresh: bool = False) -> ServedEnv:
    """What the server at ``url`` serves (cached per URL; ``fresh``: asked again)."""
    if fresh or url not in _SERVED:
        facts = request(url, "GET", "/ragen/env", None, timeout_s)
        if not isinstance(facts, dict) or facts.get("protocol") != PROTOCOL:
            raise RemoteEnvError(
                f"the env server {url} does not speak ragen's env protocol {PROTOCOL} (GET /ragen/env answered "
                f"{shown(facts, 80)}): serve the env with `ragen env serve NAME` of this version"
            )
        _SERVED[url] = ServedEnv(
            url,
            str(facts["server"]),
            str(facts["env"]),
            dict(facts["options"]),
            bool(facts["held_out_maps"]),
            frozenset(facts["methods"]) & frozenset(OPTIONAL_METHODS),
            dict(facts.get("source") or {}),
        )
    return _SERVED[url]


def check_served(served: ServedEnv, name: str, options: dict[str, Any]) -> None:
    """A :class:`RemoteEnvError` when the server does not play env ``name`` with ``options`` (the run's config
    records what the run played: the server must serve exactly that)."""
    wanted = json.loads(json.dumps(options or {}, sort_keys=True, default=str))
    if served.name != name or served.options != wanted:
        offered = f"{served.name} with options {json.dumps(served.options, sort_keys=True)}"
        asked = f"{name} with options {json.dumps(wanted, sort_keys=True)}"
        raise RemoteEnvError(
            f"the env server {served.url} serves {offered}, the run plays {asked}: serve that env (`ragen env "
            f"serve {name} -o key=value ...`) or point env.remote at a server of it"
        )


_RELEASED: dict[str, deque[str]] = {}  # by server URL: the episodes clients are done with, named at the next reset


def _release_later(url: str, episode_id: str) -> None:
    """Note that the client of episode ``episode_id`` is done with it (a finalizer may call it: nothing is sent, no
    lock is taken; the next reset on ``url`` names it)."""
    _RELEASED.setdefault(url, deque()).append(episode_id)


def _released(url: str) -> list[str]:
    """The episodes on ``url`` that clients are done with, taken from the list (a reset names them to the server)."""
    pending, taken = _RELEASED.get(url), []
    while pending:
        try:
            taken.append(pending.popleft())
        except IndexError:  # another thread took the last one
            break
    return taken


def open_env(
    name: str, options: dict[str, Any] | None = None, remote: str | None = None, timeout_s: float | None = None
) -> TextEnv:
    """The env a run plays as ``name`` with ``options``: built here (:func:`~ragen_core.envs.base.make_env`), or,
    when ``remote`` names the server that plays it (``env.remote``), a :class:`RemoteEnv` of that server (its calls
    within ``timeout_s``: ``env.user_code_timeout_s``)."""
    if remote is None:
        return make_env(name, **(options or {}))
    served = served_env(remote, timeout_s)
    check_served(served, name, options or {})
    return remote_class(served.methods)(served, timeout_s)


class RemoteEnv(TextEnv):
    """An env played on a server (module docstring): an episode per reset, its facts from the server's answers."""

    def __init__(self, served: ServedEnv, timeout_s: float | None) -> None:
        self.served, self.timeout_s = served, timeout_s
        self.name, self.held_out_maps = served.name, served.held_out_maps
        self._episode: str | None = None
        self._release: weakref.finalize | None = (
            None  # notes the episode as done with: at the next reset, or when gone
        )
        self._seed = 0
        self._actions: list[str] = []  # the actions the episode took, in order (a rebuilt episode replays them)
        self._facts: dict[str, Any] = {}  # the last answer's observation
        self._asked: dict[tuple[str, str], Any] = {}  # answers that depend on no state (reward bounds, ...)

    # -- the protocol ----------------------------------------------------------------------------------------------

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.close()  # the episode before: released with this reset
        self._seed, self._episode, self._actions = int(seed), uuid.uuid4().hex, []
        self._release = weakref.finalize(self, _release_later, self.served.url, self._episode)
        self._release.atexit = False  # a process that ends sends nothing: its server lets the episodes go by age
        body: dict[str, Any] = {"seed": self._seed, "episode_id": self._episode}
        released = _released(self.served.url)
        try:
            self._take(self._post("/reset", {**body, "release": released} if released else body), reset=True)
        except BaseException:  # named again at the next reset
            _RELEASED.setdefault(self.served.url, deque()).extend(released)
            raise
        return self._facts["text"], dict(self._facts["info"])

    def close(self) -> None:
        """Done with the episode: the server is told at the next reset on it (this client's, or another's)."""
        if self._release is not None:
            self._release()

    def step(self, action: str) -> StepResult:
        body = {"action": {"action": action}, "episode_id": self._episode, "step_index": len(self._actions)}
        answer = self._on_episode(lambda: self._post("/step", body))
        self._actions.append(action)
        facts = self._take(answer)
        reward = float(answer["reward"] or 0.0)
        return facts["text"], reward, bool(facts["terminated"]), bool(facts["truncated"]), dict(facts["info"])

    def render(self) -> str:
        return str(self._fact("render"))

    @property
    def action_names(self) -> list[str]:
        return list(self._fact("action_names"))

    def instruction(self) -> str:
        return str(self._fact("instruction"))

    def brief(self) -> str:
        return str(self._fact("brief"))

    def map_key(self) -> str:
        key = self._fact("map_key")
        return self.render() if key is None else str(key)

    @property
    def success(self) -> bool:
        return bool(self._fact("success"))

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        low, high = self._ask_served("reward_bounds", int(max_actions))
        return float(low), float(high)

    # -- the wire --------------------------------------------------------------------------------------------------

    def _where(self) -> str:
        return f" (episode of env_seed {self._seed}, step_index {len(self._actions)})" if self._episode else ""

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return request(self.served.url, "POST", path, body, self.timeout_s, self._where())

    def _fact(self, key: str) -> Any:
        if key not in self._facts:
            raise RemoteEnvError(f"{self.name} played on {self.served.url}: reset it before asking for its {key}")
        return self._facts[key]

    def _take(self, answer: dict[str, Any], reset: bool = False) -> dict[str, Any]:
        """Keep the facts of an answer's observation (a reset's: all of them; a step's: the state's); an answer from
        another start of the server must serve the same env."""
        facts = answer["observation"]
        if facts.get("server") != self.served.server:
            again = served_env(self.served.url, self.timeout_s, fresh=True)
            if not again.same_env(self.served):
                raise RemoteEnvError(
                    f"the env server {self.served.url} was started again with another env ({again.name}, options "
                    f"{json.dumps(again.options, sort_keys=True)}){self._where()}: serve the run's env again"
                )
            self.served = again
        self._facts = dict(facts) if reset else {**self._facts, **facts}
        return self._facts

    def _on_episode(self, call: Any) -> Any:
        """``call()``, once more after rebuilding the episode when the server no longer held it."""
        try:
            return call()
        except _EpisodeGone:
            self._rebuild()
        try:
            return call()
        except _EpisodeGone:
            raise RemoteEnvError(
                f"the env server {self.served.url} lost the episode again right after it was rebuilt{self._where()}"
            ) from None

    def _rebuild(self) -> None:
        """The episode again on the server: reset from its seed, its actions replayed, the state checked."""
        state = self._facts.get("text")
        taken, self._actions = self._actions, []
        self._take(self._post("/reset", {"seed": self._seed, "episode_id": self._episode}), reset=True)
        for action in taken:
            body = {"action": {"action": action}, "episode_id": self._episode, "step_index": len(self._actions)}
            self._take(self._post("/step", body))
            self._actions.append(action)
        if self._facts.get("text") != state:
            raise RemoteEnvError(
                f"the env server {self.served.url} rebuilt the episode (seed {self._seed}, {len(taken)} actions) into "
                f"another state{self._where()}: the served env is not a function of its seed and actions"
            )

    def call(self, method: str, argument: Any) -> Any:
        """``method(argument)`` of the episode's env on the server (``POST /ragen/call``)."""
        body = {"method": method, "argument": argument, "episode_id": self._episode, "step_index": len(self._actions)}
        return self._on_episode(lambda: self._post("/ragen/call", body))

    def _ask_served(self, method: str, argument: Any) -> Any:
        """``method(argument)`` of a fresh env of the server (no episode): answers that depend on no state, asked
        once per argument."""
        key = (method, json.dumps(argument))
        if key not in self._asked:
            body = {"method": method, "argument": argument, "episode_id": None, "step_index": None}
            self._asked[key] = self._post("/ragen/call", body)["value"]
        return self._asked[key]


class _Asked:
    """The optional methods of a served env, asked of the server: a client class takes those its served class
    defines (:func:`remote_class`), and keeps TextEnv's defaults for the others, as the served class does."""

    def teacher_actions(self: RemoteEnv, actions_left: int) -> list[str] | None:
        value = self.call("teacher_actions", int(actions_left))["value"]
        return None if value is None else list(value)

    def describe(self: RemoteEnv) -> str | None:
        return self._fact("describe")

    def expert_plan(self: RemoteEnv, actions_left: int) -> list[str]:
        return list(self.call("expert_plan", int(actions_left))["value"])

    def parse_action(self: RemoteEnv, text: str) -> str | None:
        return self.call("parse_action", text)["value"]

    def sample_action(self: RemoteEnv, rng: np.random.Generator) -> str:
        """The served env's draw with ``rng``: its state goes to the server and comes back advanced, as if drawn
        here."""
        answer = self.call("sample_action", rng.bit_generator.state)
        rng.bit_generator.state = answer["rng"]
        return str(answer["value"])

    def success_from_reward(self: RemoteEnv, env_reward: float) -> bool | None:
        return self._ask_served("success_from_reward", float(env_reward))

    def end_reason(self: RemoteEnv) -> str:
        reason = self._facts.get("end_reason")
        return str(reason if reason is not None else self.call("end_reason", None)["value"])


@functools.cache
def remote_class(methods: frozenset[str]) -> type[RemoteEnv]:
    """The client class of a served env that defines ``methods`` (of :data:`OPTIONAL_METHODS`): :class:`RemoteEnv`
    with those methods asked of the server, the others TextEnv's defaults, as the served class has them."""
    if not methods:
        return RemoteEnv
    defined = {name: vars(_Asked)[name] for name in sorted(methods)}
    return type("RemoteEnv", (RemoteEnv,), {"__module__": __name__, "__qualname__": "RemoteEnv", **defined})


__all__ = [
    "OPTIONAL_METHODS",
    "PROTOCOL",
    "RETRY_DELAYS",
    "RemoteEnv",
    "RemoteEnvError",
    "ServedEnv",
    "check_served",
    "open_env",
    "remote_class",
    "request",
    "served_env",
]
