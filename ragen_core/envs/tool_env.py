"""Environments whose agent acts by calling tools: :class:`ToolEnv`.

A tool env is a :class:`~ragen_core.envs.base.TextEnv` whose actions are tool calls. Its tools are typed Python
functions with docstrings, given either way:

- methods of the class marked ``@tool`` (they may read and change the instance: the answer tool that ends the
  episode), or
- plain functions listed in the class's ``functions`` tuple (a module's ``calculate``, say).

Each becomes an OpenAI function schema (:func:`ragen_core.tools.function_tool`) that the rollouts render into the
first prompt with the model's chat template (``tools=``); a reply's calls are read in the template's format
(``rollout.tool_parser``) and run here, one :meth:`ToolEnv.call` each: the arguments are checked against the
schema, the tool runs (under ``env.tool_timeout_s`` when the rollouts give a watchdog) and its result (a
:class:`~ragen_core.tools.ToolResult` or any value, taken as its text) is the step's observation, reward and end.
A call that names no tool or does not fit its schema, a tool that raises or runs past its time: each is a result
the agent reads (``error: ...``) and a record in the turn's ``tool_calls``, never a failed run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ragen_core.envs.base import StepResult, TextEnv
from ragen_core.envs.watchdog import Overran, Watchdog
from ragen_core.tools import CallRecord, Tool, ToolCall, ToolResult, check_arguments, function_tool

_TOOL_MARK = "__ragen_tool__"


def tool(function: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Mark a method of a :class:`ToolEnv` as a tool (``@tool``, or ``@tool(name="...")`` to call it otherwise)."""

    def mark(method: Callable[..., Any]) -> Callable[..., Any]:
        setattr(method, _TOOL_MARK, method.__name__ if name is None else name)
        return method

    return mark(function) if function is not None else mark


class ToolEnv(TextEnv):
    """A text env whose actions are tool calls (module docstring). Subclasses define ``reset``, ``render``,
    ``instruction``, ``success`` and ``reward_bounds`` as any env, and their tools (``@tool`` methods and/or
    ``functions``); a tool that ends the episode returns ``ToolResult(text, reward, done=True)``."""

    functions: tuple[Callable[..., Any], ...] = ()  # plain functions offered as tools, beside the @tool methods

    def tools(self) -> list[Tool]:
        """The env's tools, in declaration order (``@tool`` methods, then ``functions``); a tool whose signature a
        JSON schema cannot state, or two tools of one name, is a ValueError of one line."""
        cached = self.__dict__.get("_tools")
        if cached is not None:
            return cached
        found = [function_tool(getattr(self, n), getattr(m, _TOOL_MARK)) for n, m in _tool_methods(type(self))]
        found += [function_tool(function) for function in self.functions]
        names = [t.name for t in found]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{type(self).__name__} declares the tool(s) {', '.join(twice)} twice")
        if not found:
            raise ValueError(f"{type(self).__name__} is a ToolEnv without tools: mark methods @tool or set functions")
        self.__dict__["_tools"] = found
        return found

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' OpenAI function schemas, as a chat template takes them (``tools=``)."""
        return [t.schema() for t in self.tools()]

    @property
    def action_names(self) -> list[str]:
        """None: an action is a tool call (free-form, read by the tool-call parser)."""
        return []

    def parse_action(self, text: str) -> str | None:
        """The canonical text of a call written as JSON (``{"name": ..., "arguments": {...}}``) of one of the env's
        tools with fitting arguments, else None."""
        try:
            call = ToolCall.from_text(text.strip())
        except ValueError:
            return None
        return None if self.malformed(call) is not None else call.text()

    def sample_action(self, rng: Any) -> str:
        """A random call (the ``random`` scripted policy, ``teacher_mix``'s other draws): a tool env says what one is
        (a call's arguments are its own), or has none."""
        raise NotImplementedError(
            f"{type(self).__name__} has no random calls: define sample_action(rng) to use the random or teacher_mix "
            "scripted policies"
        )

    def step(self, action: str) -> StepResult:
        """Run the call ``action`` (:meth:`ToolCall.text`) without a time limit (scripted play); the rollouts call
        :meth:`call` with their watchdog."""
        return self.call(ToolCall.from_text(action))

    def use_tools(self, tools: list[Tool], failure: Callable[[], BaseException | None] | None = None) -> None:
        """Offer ``tools`` instead of the env's own from now on (an MCP server's joined to them:
        :func:`ragen_core.envs.mcp_tools.with_mcp_tools`). ``failure`` is asked after each call: the exception it
        returns (the server is gone) stops the run, where a tool's own error is the agent's to read."""
        self.__dict__["_tools"] = list(tools)
        self.__dict__["_failure"] = failure

    def call(self, call: ToolCall, watchdog: Watchdog | None = None) -> StepResult:
        """Run one call: the observation is the env's state after it (:meth:`render`), the reward and end those of
        the tool's :class:`ToolResult`; ``info["tool_call"]`` is the call's :class:`~ragen_core.tools.CallRecord` row,
        whose ``result`` is the text the agent is told (the tool's result, or ``error: ...``). The tool runs under
        ``watchdog`` (its time limit) when given."""
        step = self._call(call, watchdog)
        failure = self.__dict__.get("_failure")
        stop = failure() if failure is not None else None
        if stop is not None:
            raise stop
        return step

    def _call(self, call: ToolCall, watchdog: Watchdog | None) -> StepResult:
        malformed = self.malformed(call)
        if malformed is not None:
            return self._told(malformed)
        chosen = next(t for t in self.tools() if t.name == call.name)
        started = time.perf_counter()
        try:
            ok, value = _run(chosen, call.arguments, watchdog)
        except Overran:
            limit = watchdog.timeout_s if watchdog is not None else None
            text = f"error: {call.name} did not return within {limit:g} s"
            return self._told(CallRecord.of(call, text, "timeout", time.perf_counter() - started))
        duration = time.perf_counter() - started
        if ok:
            try:
                result = ToolResult.of(value)
            except Exception as exc:  # noqa: BLE001 - a value without a text (str() raised): the tool's error
                ok, value = False, exc
        if not ok:
            text = f"error: {call.name} raised {type(value).__name__}: {_said(value)}"
            return self._told(CallRecord.of(call, text, "raised", duration))
        return self._told(CallRecord.of(call, result.text, None, duration), result.reward, result.done)

    def malformed(self, call: ToolCall) -> CallRecord | None:
        """The record of a call that cannot run, the agent's error: it names no tool of the env
        (``unknown_tool``), or its arguments do not fit the tool's schema (``bad_arguments``); None when it can."""
        known = {t.name: t for t in self.tools()}
        if call.name not in known:
            return CallRecord.of(call, f"error: unknown tool {call.name!r}; tools: {', '.join(known)}", "unknown_tool")
        problem = check_arguments(known[call.name], call.arguments)
        return None if problem is None else CallRecord.of(call, f"error: {problem}", "bad_arguments")

    def _told(self, record: CallRecord, reward: float = 0.0, done: bool = False) -> StepResult:
        """The step result of a call's record: what the agent is told, and the flags every step's info carries."""
        info = {
            "success": bool(self.success),
            "action_is_valid": record.error not in ("unknown_tool", "bad_arguments"),
            "action_is_effective": record.error is None,
            "tool_call": record.row(),
        }
        return self.render(), float(reward), bool(done), False, info


def _tool_methods(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    """The ``@tool`` methods of ``cls`` and its bases, each once by name, in the order the classes define them; a
    ValueError of one line for one that replaces a method every env has (``describe``, ``render``, ...), which the
    rollouts call with their own arguments."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            if callable(member) and hasattr(member, _TOOL_MARK):
                if hasattr(TextEnv, name):
                    raise ValueError(
                        f"{cls.__name__}.{name} is marked @tool but replaces TextEnv.{name}, which the rollouts call; "
                        f"name the method otherwise and keep the tool's name with @tool(name={name!r})"
                    )
                found[name] = member
    return list(found.items())


def _run(chosen: Tool, arguments: dict[str, Any], watchdog: Watchdog | None) -> tuple[bool, Any]:
    """(True, the tool's value) or (False, what it raised); :class:`Overran` past the watchdog's limit."""
    if watchdog is not None:
        return watchdog.call(lambda given: chosen.function(**given), arguments)
    try:
        return True, chosen.function(**arguments)
    except Exception as exc:  # noqa: BLE001 - the tool's error is the agent's to read
        return False, exc


ERROR_CHARACTERS = 300  # of a tool's exception as the agent reads it: a traceback's worth would fill its context


def _said(error: BaseException) -> str:
    """What ``error`` says, on one line, cut to :data:`ERROR_CHARACTERS`."""
    try:
        text = " ".join(str(error).split())
    except Exception:  # noqa: BLE001 - an exception whose message itself raises
        text = "(its message could not be read)"
    return text if len(text) <= ERROR_CHARACTERS else text[: ERROR_CHARACTERS - 3] + "..."


def is_tool_env(env: Any) -> bool:
    """Whether ``env`` acts by tool calls (a :class:`ToolEnv`)."""
    return isinstance(env, ToolEnv)


__all__ = ["ToolEnv", "is_tool_env", "tool"]
