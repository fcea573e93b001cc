"""Code of the user's own, named by import path: environments and functions outside this project.

An environment name is a registered one (``bandit``), a name that an installed distribution registers under the
entry-point group :data:`ENTRY_POINT_GROUP` (``ragen.envs``, name -> ``module:Class``), or ``package.module:Class``
of any importable module. The class implements the :class:`~ragen_core.envs.base.TextEnv` protocol (a subclass whose
abstract methods and ``reward_bounds`` are implemented: :func:`check_env_class`). A function (the dataset env's
reward) is ``package.module:function`` (:func:`import_object`). Importing is the only thing done here: whether a
config read back from the data root may name such a module is :mod:`ragen_core.config.trust`'s decision, taken
before anything is imported.

Every failure is a ``ValueError`` of one line that says what to do: a malformed path, a module that cannot be
imported (missing, or raising while it imports), a missing attribute, a class that is not a text environment. While
a run plays an environment of the user's own, :func:`env_reset` and :func:`env_step` turn what its code raises or
wrongly returns into a :class:`UserCodeError` of one line naming the class, the call and the error; given a
:class:`~ragen_core.envs.watchdog.Watchdog` (``env.user_code_timeout_s``), they run the user's code under its time
limit, and a call that does not return, or that exits the process (``sys.exit``), is such an error too, naming the
rollout's row.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any

import numpy as np

from ragen_core.envs.base import StepResult, TextEnv
from ragen_core.envs.watchdog import Overran, Watchdog

ENTRY_POINT_GROUP = "ragen.envs"
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_PATH = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}(\.{_IDENTIFIER})*")
# What a TextEnv subclass must define itself: the abstract methods, and reward_bounds (the base one raises; the
# batch pipeline's data contracts need it).
REQUIRED = ("reset", "step", "render", "action_names", "instruction", "success", "reward_bounds")


def is_import_path(name: str) -> bool:
    """Whether ``name`` names code by import path (it holds ``:``) rather than a registered name."""
    return ":" in name


ENV_EXAMPLE, FUNCTION_EXAMPLE = "my_envs.maze:MazeEnv", "my_rewards.math:score"


def metric_env_name(name: str) -> str:
    """The name of environment ``name`` in metric keys (``val/<it>/success``): a registered or entry-point name as
    it is, an import path by its class's own name (``my_envs.coin:CoinEnv`` is ``CoinEnv``), so that metric names
    stay short in the lake, the trackers and plots. Two validation envs with one class name are refused by the
    config's checks."""
    return name.rsplit(":", 1)[1].rsplit(".", 1)[-1] if is_import_path(name) else name


def check_import_path(text: str, what: str, example: str = ENV_EXAMPLE) -> tuple[str, str]:
    """(module, attribute path) of ``text`` when it reads ``package.module:Name``; else a ``ValueError`` naming
    ``what`` (the key that gave it) and the form, with ``example``."""
    if not isinstance(text, str) or not _IMPORT_PATH.fullmatch(text):
        raise ValueError(
            f"{what}: {text!r} is not an import path: write package.module:Name (e.g. {example}), "
            "the module importable (installed, or its folder on PYTHONPATH)"
        )
    module, attribute = text.split(":", 1)
    return module, attribute


def one_line(exc: BaseException) -> str:
    """``<type>: <message>`` of ``exc`` on one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


class UserCodeError(RuntimeError):
    """The user's own code (an environment class from outside this package, the dataset env's reward function)
    raised, or returned what it must not, while a run played it: one line naming the code, the call and what went
    wrong. The run stops there and its manifest keeps the line; the user's traceback is the exception's
    ``__cause__`` (the Python API's callers can read it)."""


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _users(env: Any) -> bool:
    """Whether ``env`` is an environment of the user's own (its class defined outside ``ragen_core``)."""
    return type(env).__module__.partition(".")[0] != "ragen_core"


TIMEOUT_KEY = "env.user_code_timeout_s"  # the config key of the limit, named in the message of a call that overran
Where = Callable[[], str] | None  # the rollout's row of a call (env, seed, group, trajectory, turn), said on demand


def _at(where: Where) -> str:
    return f" ({where()})" if where is not None else ""


def failure(called: str, exc: BaseException, where: Where = None) -> UserCodeError:
    """The one-line error of the user's code ``called`` that raised ``exc``: ``sys.exit`` (a ``SystemExit``) is
    named as the exit it asked for, with the row (``where``); anything else as its type and message."""
    if isinstance(exc, SystemExit):
        return UserCodeError(f"{called} called sys.exit({exc.code!r}){_at(where)}: return a value, never exit")
    return UserCodeError(f"{called} raised {one_line(exc)}")


def guarded_call(
    called: str, function: Callable[[Any], Any], argument: Any, watchdog: Watchdog | None, where: Where = None
) -> Any:
    """``function(argument)``, the user's code ``called``, under the ``watchdog``'s time limit (None: in this
    thread, no limit). What it raises, ``sys.exit`` included, and a call still running when its time is up are each
    a :class:`UserCodeError` of one line; a :class:`UserCodeError` it raises (the dataset env's reward, already
    named) passes as it is, and so does a stop of the process (Ctrl-C)."""
    try:
        returned, result = (watchdog or Watchdog(None)).call(function, argument)
    except Overran:
        raise UserCodeError(
            f"{called} did not return within {watchdog.timeout_s:g} s{_at(where)}: it may hang; if it only needs "
            f"longer, raise {TIMEOUT_KEY}"
        ) from None
    if returned:
        return result
    if isinstance(result, UserCodeError):
        raise result
    raise failure(called, result, where) from result


def _called(env: Any, method: str, argument: Any) -> str:
    return f"environment {type(env).__module__}:{type(env).__qualname__}.{method}({shown(argument, 40)})"


def as_number(value: Any) -> float | None:
    """The reward a user's function returned, as a float: an int or float, or numpy's integer and floating scalars
    (``np.int64``, ``np.float32``; converted exactly: every float32 is a float64), never a bool; None otherwise."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    return float(value)


def env_reset(env: TextEnv, seed: int, watchdog: Watchdog | None = None, where: Where = None) -> tuple[str, dict]:
    """``env.reset(seed)``; for an environment of the user's own (run under the ``watchdog``: :func:`guarded_call`),
    a :class:`UserCodeError` of one line when it raises, does not return or returns other than ``(observation
    text, info dict)``."""
    if not _users(env):
        return env.reset(seed)
    called = _called(env, "reset", seed)
    result = guarded_call(called, env.reset, seed, watchdog, where)
    if not (
        isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str) and isinstance(result[1], dict)
    ):
        raise UserCodeError(f"{called} returned {shown(result)}: return (observation text, info dict)")
    return result


def env_step(env: TextEnv, action: str, watchdog: Watchdog | None = None, where: Where = None) -> StepResult:
    """``env.step(action)``. For an environment of the user's own, run under the ``watchdog`` (:func:`guarded_call`;
    ``where`` names the rollout's row in its errors): a :class:`UserCodeError` of one line when it raises, does not
    return, or returns other than ``(observation text, reward number, terminated, truncated, info dict)`` or a
    reward that is not finite; numpy's numbers and booleans are taken as Python's. A built-in env whose step runs
    the user's code (:meth:`~ragen_core.envs.base.TextEnv.user_code`: the dataset env's reward function) runs under
    the same limit; any other built-in step is called as it is."""
    if not _users(env):
        called = env.user_code(action)
        if called is None:
            return env.step(action)
        return guarded_call(called, env.step, action, watchdog, where)
    called = _called(env, "step", action)
    result = guarded_call(called, env.step, action, watchdog, where)
    if not (
        isinstance(result, tuple)
        and len(result) == 5
        and isinstance(result[0], str)
        and as_number(result[1]) is not None
        and all(isinstance(flag, bool | np.bool_) for flag in result[2:4])
        and isinstance(result[4], dict)
    ):
        raise UserCodeError(
            f"{called} returned {shown(result)}: return (observation text, reward number, terminated bool, "
            "truncated bool, info dict)"
        )
    text, reward, terminated, truncated, info = result
    number = as_number(reward)
    if not math.isfinite(number):
        raise UserCodeError(f"{called} returned the reward {number!r}{_at(where)}: a reward is a finite number")
    return text, number, bool(terminated), bool(truncated), info


def import_module(module: str, what: str) -> Any:
    """Import ``module``; a ``ValueError`` of one line when it is missing or raises while it imports."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            raise ValueError(
                f"{what}: cannot import module {module!r} (no module named {exc.name!r}): install the distribution "
                "that provides it, or put its folder on PYTHONPATH"
            ) from None
        raise ValueError(f"{what}: importing module {module!r} failed: {one_line(exc)}") from None
    except Exception as exc:  # the user's module raised while importing: said in one line, never a traceback
        raise ValueError(f"{what}: importing module {module!r} failed: {one_line(exc)}") from None


def import_object(text: str, what: str, example: str = ENV_EXAMPLE) -> Any:
    """The object ``package.module:Name`` (``Name`` may be dotted: ``Outer.inner``) names, imported; ``what`` names
    the key that gave it in the errors (:func:`check_import_path`, with ``example``; :func:`import_module`; a
    missing attribute)."""
    module_name, attribute = check_import_path(text, what, example)
    found: Any = import_module(module_name, what)
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{what}: module {module_name!r} has no attribute {attribute!r} ({text})")
        found = getattr(found, part)
    return found


def check_env_class(env_class: Any, name: str, what: str) -> type[TextEnv]:
    """``env_class`` when it is a class implementing the TextEnv protocol (a subclass of
    :class:`~ragen_core.envs.base.TextEnv` defining :data:`REQUIRED`); else a ``ValueError`` of one line."""
    if not inspect.isclass(env_class) or not issubclass(env_class, TextEnv):
        raise ValueError(
            f"{what}: {name!r} is {'a class' if inspect.isclass(env_class) else 'a ' + type(env_class).__name__} "
            "that is not a TextEnv: subclass ragen_core.envs.TextEnv (docs/usage.md, 'Your own environment')"
        )
    missing = [method for method in REQUIRED if getattr(env_class, method, None) is getattr(TextEnv, method)]
    missing += sorted(set(getattr(env_class, "__abstractmethods__", ())) - set(missing))
    if missing:
        raise ValueError(
            f"{what}: {name!r} does not implement the TextEnv protocol: missing {', '.join(missing)} "
            "(docs/usage.md, 'Your own environment')"
        )
    return env_class


def entry_point_envs() -> dict[str, metadata.EntryPoint]:
    """The environments installed distributions register: entry points of :data:`ENTRY_POINT_GROUP`, by name (a
    name registered twice: the first distribution found keeps it)."""
    found: dict[str, metadata.EntryPoint] = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry)
    return found


@lru_cache(maxsize=256)
def external_env_class(name: str, what: str = "env.name") -> type[TextEnv]:
    """The environment class of ``name``: ``package.module:Class``, or an entry point of :data:`ENTRY_POINT_GROUP`
    (a registered name is the registry's, :func:`ragen_core.envs.base.make_env`); a ``ValueError`` of one line when
    it is neither, cannot be imported or is no TextEnv. Cached per name: rollouts build an env per trajectory."""
    if is_import_path(name):
        return check_env_class(import_object(name, what), name, what)
    entry = entry_point_envs().get(name)
    if entry is None:
        raise ValueError(f"{what}: unknown environment {name!r}")
    path = f"{entry.module}:{entry.attr}" if entry.attr else entry.value
    distribution = f" of distribution {entry.dist.name!r}" if entry.dist is not None else ""
    return check_env_class(import_object(path, f"{what} {name!r} (entry point{distribution})"), name, what)


@dataclass(frozen=True)
class CodeSource:
    """Where a piece of code comes from: its import path, and the distribution (name, version) that installed its
    module (None: a module on PYTHONPATH or in a working folder, installed by no distribution)."""

    import_path: str
    distribution: str | None
    version: str | None

    def to_dict(self) -> dict[str, str | None]:
        """The manifest's form."""
        return {"import_path": self.import_path, "distribution": self.distribution, "version": self.version}


def code_source(code: Any) -> CodeSource:
    """The :class:`CodeSource` of a class or function (its module's top-level package, looked up among the
    installed distributions' packages)."""
    module = getattr(code, "__module__", None) or "?"
    path = f"{module}:{getattr(code, '__qualname__', getattr(code, '__name__', '?'))}"
    names = metadata.packages_distributions().get(module.split(".")[0]) or []
    if not names:
        return CodeSource(path, None, None)
    try:
        return CodeSource(path, names[0], metadata.version(names[0]))
    except metadata.PackageNotFoundError:
        return CodeSource(path, names[0], None)


def env_source(name: str, factory: Any) -> CodeSource:
    """Where environment ``name`` (built by ``factory``, :func:`ragen_core.envs.base.env_factory`'s) comes from: an
    entry point's own import path and distribution, else the factory's module (:func:`code_source`)."""
    entry = None if is_import_path(name) else entry_point_envs().get(name)
    if entry is not None and getattr(factory, "__module__", None) == entry.module:
        dist = entry.dist
        return CodeSource(entry.value, dist.name if dist else None, dist.version if dist else None)
    return code_source(factory)


__all__ = [
    "ENTRY_POINT_GROUP",
    "TIMEOUT_KEY",
    "CodeSource",
    "UserCodeError",
    "as_number",
    "check_env_class",
    "check_import_path",
    "code_source",
    "entry_point_envs",
    "env_reset",
    "env_source",
    "env_step",
    "external_env_class",
    "failure",
    "guarded_call",
    "import_object",
    "is_import_path",
    "metric_env_name",
    "one_line",
    "shown",
]
