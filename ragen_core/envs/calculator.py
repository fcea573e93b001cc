"""Calculator arithmetic: multi-step word problems solved with a ``calculate`` tool, answered with an ``answer`` tool.

An instance, drawn from the seed alone (nothing is downloaded): a place holds a number of things, and ``steps``
events change it (things received, sold, multiplied); the question is how many there are at the end. The numbers
(``min_number`` to ``max_number``, 100 to 9999 by default) are larger than the tiny model can add in its head, so
the way to the answer is the tool: ``calculate(expression)`` evaluates +, -, *, /, parentheses, integers and
decimals exactly (a safe evaluator over Python's ``ast``: anything else is refused, nothing is ``eval``-ed), and
``answer(value)`` gives the final answer, which ends the episode: reward ``correct_reward`` when it is the question's
value, else 0.

Why an ``answer`` tool rather than an ``<answer>`` tag: every reply then has one format, the chat template's tool
calls (one parser, one format check, the answer's type checked by its schema like any argument), and a model served
with these tools (vLLM's tool parser, an OpenAI-style client) sees an ordinary function, nothing of this project's
tags. The expert (``expert_plan``, the teacher of ``teacher_mix``) calls ``calculate`` once per event, each on the
result of the one before, then answers. Instances are split between training and validation by the question's
text (``held_out_maps``): validation never meets a problem that training or the bootstrap played.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Any

import numpy as np

from ragen_core.envs.base import bounded, bounded_reward, register_env
from ragen_core.envs.tool_env import ToolEnv, tool
from ragen_core.tools import ToolCall, ToolResult

MAX_EXPRESSION = 200  # characters of one expression: bounds its nesting and its numbers
_NUMBER = re.compile(r"\d+(\.\d+)?")
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
PLACES = (("warehouse", "boxes"), ("farm", "apples"), ("library", "books"), ("bakery", "rolls"), ("shop", "candles"))
EVENTS = {
    "+": ("receives {n} more {things}", "buys {n} {things}"),
    "-": ("sells {n} {things}", "gives away {n} {things}"),
    "*": ("gets {n} times as many {things}",),
}


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression of integers and decimals with +, -, *, / and parentheses; a
    ValueError (ZeroDivisionError for a division by zero) of one line for anything else."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION:
        raise ValueError(f"an expression is a string of at most {MAX_EXPRESSION} characters")
    source = expression.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"{source!r} is not an arithmetic expression") from None
    return _value(tree.body, source)


def _value(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.BinOp) and isinstance(node.op, _OPERATORS):
        left, right = _value(node.left, source), _value(node.right, source)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ZeroDivisionError("division by zero")
        return left / right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _value(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        text = ast.get_source_segment(source, node) or ""
        if _NUMBER.fullmatch(text):
            return Fraction(text)
    raise ValueError("only numbers (like 12 or 3.5), + - * / and parentheses are allowed")


def format_number(value: Fraction) -> str:
    """``value`` as the calculator shows it: a whole number as an integer, a decimal exactly when it has at most 12
    places, else rounded to 12 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    for places in range(1, 13):
        scaled = value * 10**places
        if scaled.denominator == 1:  # exact in `places` decimals: written from the integer (Fraction has no "f")
            digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
            return f"{'-' if scaled < 0 else ''}{digits[:-places]}.{digits[-places:]}"
    return f"{float(value):.12g}"


@register_env("calculator")
class CalculatorEnv(ToolEnv):
    """Multi-step word problems with a calculator tool (module docstring)."""

    name = "calculator"
    held_out_maps = True

    def __init__(
        self,
        steps: int = 2,
        min_number: int = 100,
        max_number: int = 9999,
        operations: str = "+-",
        correct_reward: float = 1.0,
    ) -> None:
        self.steps = bounded("steps", steps, 1, 10)
        self.max_number = bounded("max_number", max_number, 2, 10**9)
        self.min_number = bounded("min_number", min_number, 1, self.max_number - 1)
        if not operations or set(operations) - set(EVENTS):
            raise ValueError(f"operations must be some of {''.join(EVENTS)}, got {operations!r}")
        self.operations = "".join(dict.fromkeys(operations))
        self.correct_reward = bounded_reward("correct_reward", correct_reward)
        if self.correct_reward <= 0:
            raise ValueError(f"correct_reward must be above 0, got {correct_reward!r}")
        self.question, self.start, self.events, self.chain = "", 0, [], []
        self.results: list[str] = []
        self.work: list[str] = []  # the calls so far and what they gave, as render() shows them
        self.answered: float | None = None
        self.won = False

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Draw the instance of ``seed``: a place, its starting count and ``steps`` events (module docstring)."""
        rng = np.random.default_rng(seed)
        place, things = PLACES[int(rng.integers(len(PLACES)))]
        value = int(rng.integers(self.min_number, self.max_number + 1))
        self.start, self.events, self.chain = value, [], []
        sentences = []
        for _ in range(self.steps):
            operation = self.operations[int(rng.integers(len(self.operations)))]
            if operation == "-" and value <= self.min_number:
                operation = "+"
            number = self._number(rng, operation, value)
            phrases = EVENTS[operation]
            sentences.append(phrases[int(rng.integers(len(phrases)))].format(n=number, things=things))
            value = int(evaluate(f"{value} {operation} {number}"))
            self.events.append((operation, number))
            self.chain.append(value)
        self.question = (
            f"A {place} has {self.start} {things}. It {', then it '.join(sentences)}. How many {things} does it have "
            "now?"
        )
        self.results, self.work, self.answered, self.won = [], [], None, False
        return self.render(), {"success": False}

    def _number(self, rng: np.random.Generator, operation: str, value: int) -> int:
        """The number of one event on ``value``: a count to add, or to take away (never all there is), from
        ``min_number``; or a factor from 2 to 9."""
        if operation == "*":
            return int(rng.integers(2, 10))
        high = self.max_number if operation == "+" else value - 1
        return int(rng.integers(self.min_number, high + 1))

    def render(self) -> str:
        """The question, then each call that ran well and what it gave."""
        return "\n".join([self.question, *self.work])

    def map_key(self) -> str:
        """The question's text: what splits instances between training and validation (``held_out_maps``)."""
        return self.question

    def instruction(self) -> str:
        return (
            "Solve the problem with the tools: call calculate for each step, one call per reply, then call answer "
            "with the result."
        )

    def brief(self) -> str:
        return "Call calculate for each step, then answer."

    @property
    def success(self) -> bool:
        return self.won

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, self.correct_reward

    def success_from_reward(self, env_reward: float) -> bool | None:
        return env_reward == self.correct_reward

    def end_reason(self) -> str:
        return "success" if self.won else "wrong_answer"

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: integers or decimals with + - * / and parentheses, e.g. (1200 + 34) * 2
        """
        result = format_number(evaluate(expression))
        self.results.append(result)
        self.work.append(f"calculate({expression}) = {result}")
        return result

    @tool
    def answer(self, value: float) -> ToolResult:
        """Give the final answer to the question; this ends the episode.

        Args:
            value: the number that answers the question
        """
        self.answered = value
        self.won = Fraction(str(value)) == self.chain[-1]
        verdict = f"{format_number(Fraction(str(value)))} is {'right' if self.won else 'wrong'}."
        self.work.append(f"answer({value}): {verdict}")
        return ToolResult(verdict, self.correct_reward if self.won else 0.0, done=True)

    def expert_plan(self, actions_left: int) -> list[str]:
        """Every call left: ``calculate`` on the value reached so far and the next event's number, one per event
        not yet computed (the values already among the results count as done, in order), then ``answer``."""
        done = 0
        while done < len(self.chain) and format_number(Fraction(self.chain[done])) in self.results:
            done += 1
        values = [self.start, *self.chain]
        plan = [
            ToolCall("calculate", {"expression": f"{values[i]} {op} {number}"}).text()
            for i, (op, number) in enumerate(self.events)
            if i >= done
        ]
        return [*plan, ToolCall("answer", {"value": self.chain[-1]}).text()]

    def teacher_actions(self, actions_left: int) -> list[str] | None:
        """The expert's next call."""
        return self.expert_plan(actions_left)[:1]

    def sample_action(self, rng: np.random.Generator) -> str:
        """A plausible call: ``calculate`` on two of the question's numbers with a random operation, or ``answer``
        with one of them (wrong but well-formed: what a bootstrap's non-teacher replies show)."""
        numbers = [self.start, *(number for _, number in self.events)]
        first, second = (numbers[int(i)] for i in rng.integers(len(numbers), size=2))
        if rng.random() < 0.5:
            operation = self.operations[int(rng.integers(len(self.operations)))]
            return ToolCall("calculate", {"expression": f"{first} {operation} {second}"}).text()
        return ToolCall("answer", {"value": first}).text()
