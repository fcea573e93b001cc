"""The episodes an env server holds (:class:`EnvServer`, served over HTTP by :mod:`ragen_core.envs.serving`): a
fresh env per reset under an episode id, its steps applied once, the calls that take an argument.

Episodes are independent envs: each has a lock of its own, so a slow or hung call of one episode never holds up
another's (the server's lock guards only the table of episodes, never an env's call). An env's code may thus run for
several episodes at once, each in its own thread: an env class that shares state between its instances guards it.
A client names the episodes it is done with (``release``, at its next reset: :mod:`ragen_core.envs.remote`), so
the server holds about the episodes its clients play; beyond :data:`MAX_EPISODES` (clients that never say) the least
recently used is let go, and a client of ours rebuilds it if it comes back.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragen_core.envs.base import TextEnv, env_factory, make_env
from ragen_core.envs.external import UserCodeError, env_reset, env_source, env_step, one_line, shown
from ragen_core.envs.remote import CONFLICT, GONE, OPTIONAL_METHODS, PROTOCOL
from ragen_core.envs.tool_env import is_tool_env

# Episodes held at once (each an env instance); the least recently used beyond is let go. Clients release theirs, so
# this bounds only what clients that never do (OpenEnv's HTTP clients) leave behind; `ragen env serve --max-episodes`
MAX_EPISODES = 2_048
BAD_REQUEST = 422


class Refused(Exception):
    """A request answered with an error ``status`` and one line (``message``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, " ".join(message.split())


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
    """One episode: its env, its seed, the steps it took, the last step's action and answer, and its lock (its calls
    one at a time; other episodes' calls meanwhile go on)."""

    env: TextEnv
    seed: int
    steps: int = 0
    last: tuple[str, dict[str, Any]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


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
    """The episodes of env ``name`` built with ``options`` (module docstring): each episode's calls one at a time,
    the episodes side by side."""

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
        self._lock = threading.Lock()  # the table of episodes only: never held while an env is called
        self._probe_lock = threading.Lock()  # the calls of the fresh env (answers that depend on no state)

    @property
    def held(self) -> int:
        """How many episodes the server holds now."""
        with self._lock:
            return len(self._episodes)

    def facts(self) -> dict[str, Any]:
        """``GET /ragen/env``: what this server serves (and how many episodes it holds, of how many)."""
        return {
            "protocol": PROTOCOL,
            "server": self.server,
            "env": self.name,
            "options": jsonable(self.options),
            "held_out_maps": bool(self.probe.held_out_maps),
            "methods": self.methods,
            "source": self.source,
            "episodes": {"held": self.held, "capacity": self.capacity},
        }

    def _guarded(self, called: str, function: Callable[[], Any]) -> Any:
        """``function()``; what the env raises is :class:`Refused` (500) naming the env and ``called``."""
        try:
            return function()
        except UserCodeError as exc:
            raise Refused(500, str(exc)) from None
        except Exception as exc:  # the env's own error, said in one line to the client, which stops its run with it
            raise Refused(500, f"environment {self.name} {called} raised {one_line(exc)}") from None

    def reset(self, seed: int | None, episode_id: str | None, release: Iterable[str] = ()) -> dict[str, Any]:
        """A fresh env reset with ``seed`` (None: one drawn) as episode ``episode_id`` (None: a new id); the episodes
        ``release`` names (the client is done with them) are let go first."""
        for done in release:
            self.drop(done)
        seed = secrets.randbelow(2**32) if seed is None else seed
        episode_id = episode_id or uuid.uuid4().hex
        env = self._guarded("when built", lambda: make_env(self.name, **self.options))
        text, info = self._guarded(f"reset({seed})", lambda: env_reset(env, seed))
        episode = Episode(env, seed)
        answer = self._guarded(f"after reset({seed})", lambda: self._answer(episode_id, episode, text, info))
        with self._lock:
            self._episodes[episode_id] = episode
            self._episodes.move_to_end(episode_id)
            while len(self._episodes) > self.capacity:
                self._episodes.popitem(last=False)
        return answer

    def step(self, episode_id: str, action: str, step_index: int | None) -> dict[str, Any]:
        """``action`` applied to the episode, once: a step sent again (its index and action) answers from its
        record; another index than the episode's is refused (409)."""
        episode = self._episode(episode_id)
        with episode.lock:
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
        episode = None if episode_id is None else self._episode(episode_id)
        with self._probe_lock if episode is None else episode.lock:
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
        """``GET /state``: the episode's id and steps (asked while a call of the episode runs: the steps before it)."""
        return {"episode_id": episode_id, "step_count": self._episode(episode_id).steps}

    def drop(self, episode_id: str) -> None:
        """Let the episode go (its session closed, or its client released it); an unknown id is nothing."""
        with self._lock:
            self._episodes.pop(episode_id, None)

    def _episode(self, episode_id: str) -> Episode:
        with self._lock:
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


__all__ = ["BAD_REQUEST", "MAX_EPISODES", "EnvServer", "Episode", "Refused", "jsonable"]
