"""A tool env of the user's own: tools from methods and plain functions, a call's outcome for each way it can go
(a result, a score that ends the episode, an unknown tool, arguments that do not fit, a tool that raises, one that
runs past its time), and the refusals of a class whose tools cannot be described."""

from __future__ import annotations

import time

import pytest

from ragen_core.envs import ToolEnv, tool
from ragen_core.envs.watchdog import Watchdog
from ragen_core.tools import ToolCall, ToolResult


def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()


class Counter(ToolEnv):
    """Count to a target with add; finish says whether the count is the target."""

    name = "counter"
    functions = (shout,)

    def reset(self, seed):
        self.count, self.target, self.won = 0, seed, False
        return self.render(), {"success": False}

    def render(self):
        return f"count {self.count}, target {self.target}"

    def instruction(self):
        return "Reach the target."

    @property
    def success(self):
        return self.won

    def reward_bounds(self, max_actions):
        return 0.0, 1.0

    @tool
    def add(self, amount: int) -> int:
        """Add to the count.

        Args:
            amount: what to add
        """
        if amount < 0:
            raise ValueError("only forward")
        self.count += amount
        return self.count

    @tool(name="finish")
    def done(self) -> ToolResult:
        """Stop counting."""
        self.won = self.count == self.target
        return ToolResult("yes" if self.won else "no", float(self.won), done=True)

    @tool
    def nap(self, seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return "awake"


def _call(env, name, watchdog=None, **arguments):
    return env.call(ToolCall(name, arguments), watchdog)


def test_methods_then_functions_are_the_tools():
    env = Counter()
    assert [t.name for t in env.tools()] == ["add", "finish", "nap", "shout"]
    assert env.tool_schemas()[0] == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add to the count.",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "integer", "description": "what to add"}},
                "required": ["amount"],
                "additionalProperties": False,
            },
        },
    }
    assert env.action_names == []


def test_each_outcome_of_a_call():
    env = Counter()
    env.reset(5)
    state, reward, terminated, truncated, info = _call(env, "add", amount=3)
    assert (state, reward, terminated, truncated) == ("count 3, target 5", 0.0, False, False)
    assert info["tool_call"]["result"] == "3" and info["tool_call"]["error"] is None
    assert info["action_is_valid"] and info["action_is_effective"] and info["tool_call"]["duration_s"] >= 0
    assert _call(env, "shout", text="hi")[4]["tool_call"]["result"] == "HI"
    outcomes = {
        "unknown_tool": _call(env, "multiply", amount=2),
        "bad_arguments": _call(env, "add", amount="two"),
        "raised": _call(env, "add", amount=-1),
    }
    for error, (_, reward, terminated, _, info) in outcomes.items():
        assert (info["tool_call"]["error"], reward, terminated, info["action_is_effective"]) == (
            error,
            0.0,
            False,
            False,
        )
    assert outcomes["unknown_tool"][4]["tool_call"]["result"] == (
        "error: unknown tool 'multiply'; tools: add, finish, nap, shout"
    )
    assert (
        outcomes["bad_arguments"][4]["tool_call"]["result"]
        == "error: add: argument 'amount' must be an integer, got 'two'"
    )
    assert outcomes["raised"][4]["tool_call"]["result"] == "error: add raised ValueError: only forward"
    assert outcomes["raised"][4]["action_is_valid"] and not outcomes["unknown_tool"][4]["action_is_valid"]
    assert env.count == 3  # none of them changed the count
    _call(env, "add", amount=2)
    _, reward, terminated, _, info = _call(env, "finish")
    assert (reward, terminated, env.success, info["tool_call"]["result"]) == (1.0, True, True, "yes")


def test_a_tool_past_its_time_is_abandoned_and_the_next_call_runs():
    env = Counter()
    env.reset(1)
    with Watchdog(0.2) as watchdog:
        started = time.monotonic()
        _, _, _, _, info = _call(env, "nap", watchdog, seconds=30)
        assert time.monotonic() - started < 5
        assert info["tool_call"]["error"] == "timeout"
        assert info["tool_call"]["result"] == "error: nap did not return within 0.2 s"
        assert 0.2 <= info["tool_call"]["duration_s"] < 5
        assert _call(env, "add", watchdog, amount=1)[4]["tool_call"]["result"] == "1"


def test_a_class_whose_tools_cannot_be_described_is_refused():
    class Untyped(Counter):
        @tool
        def add(self, amount):  # noqa: ANN001 - the case under test
            """No hint."""

    class Twice(Counter):
        functions = (shout, shout)

    class Bare(ToolEnv):
        reset = render = instruction = reward_bounds = Counter.reset
        success = False

    class Shadowing(Counter):
        @tool
        def describe(self, table: str) -> str:
            """A tool that would replace the state description the rollouts ask every env for."""
            return table

    class Renamed(Counter):
        @tool(name="describe")
        def describe_table(self, table: str) -> str:
            """The same tool, its method named otherwise."""
            return table

    with pytest.raises(ValueError, match="tool add: parameter 'amount' has no type hint"):
        Untyped().tools()
    with pytest.raises(ValueError, match="Twice declares the tool\\(s\\) shout twice"):
        Twice().tools()
    with pytest.raises(ValueError, match="Bare is a ToolEnv without tools"):
        Bare().tools()
    with pytest.raises(ValueError, match=r"Shadowing.describe is marked @tool but replaces TextEnv.describe"):
        Shadowing().tools()
    assert "describe" in [t.name for t in Renamed().tools()] and Renamed().describe() is None


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")


class Noisy(Counter):
    @tool
    def crash(self, lines: int) -> str:
        """Raise an error of many lines."""
        raise ValueError("\n".join(f"line {i}" for i in range(lines)))

    @tool
    def opaque(self) -> str:
        """Return a value that has no text."""
        return Unprintable()


def test_a_tool_s_error_reaches_the_agent_on_one_bounded_line():
    env = Noisy()
    env.reset(1)
    short = _call(env, "crash", lines=2)[4]["tool_call"]
    assert short["result"] == "error: crash raised ValueError: line 0 line 1" and short["error"] == "raised"
    long = _call(env, "crash", lines=400)[4]["tool_call"]["result"]
    prefix = "error: crash raised ValueError: "
    assert "\n" not in long and len(long) == len(prefix) + 300 and long.endswith("...")
    opaque = _call(env, "opaque")[4]["tool_call"]
    assert (opaque["error"], opaque["result"]) == ("raised", "error: opaque raised RuntimeError: no text")
