"""Countdown (shipped by RAGEN beyond the paper's three envs): reach the target with each number used exactly once.

One turn, one action: the answer is an arithmetic equation over the given numbers with ``+ - * /`` and brackets.
Reward (as RAGEN's): 1 if it evaluates to the target using exactly the given numbers, 0.1 if it uses exactly the
numbers but misses the target, else 0. RAGEN reads a public dataset; we draw instances from the seed instead:
3-4 numbers in ``[min_number, max_number]`` combined by a random expression whose value (a whole number in
``[1, max_target]``) becomes the target, so every instance is solvable.

Model text is never ``eval``-ed: :func:`parse_equation` is a small recursive-descent parser over exact fractions.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from itertools import permutations
from typing import Any

import numpy as np

from ragen_core.envs.base import StepResult, TextEnv, bounded, bounded_reward, register_env

_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")
_MAX_LITERAL_DIGITS = 6


class EquationError(ValueError):
    """The text is not an arithmetic expression over whole numbers, + - * / and brackets."""


@dataclass(frozen=True)
class Equation:
    """A parsed equation: its exact value (None after a division by zero) and the numbers it uses."""

    value: Fraction | None
    numbers: tuple[int, ...]


def _tokenize(text: str) -> list[str]:
    tokens, position = [], 0
    text = text.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:  # only trailing whitespace is left
            break
        number, symbol = match.groups()
        if number is not None:
            if len(number) > _MAX_LITERAL_DIGITS:
                raise EquationError(f"number {number[:10]}... is too long")
            tokens.append(number)
        elif symbol in "+-*/()":
            tokens.append(symbol)
        else:
            raise EquationError(f"unexpected character {symbol!r}")
        position = match.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ; factor := NUMBER | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.index, self.numbers = tokens, 0, []
        self.divided_by_zero = False

    def _peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise EquationError("the expression ends too early")
        self.index += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self._peek() in ("+", "-"):
            value = value + self.term() if self._take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self._peek() in ("*", "/"):
            operator, right = self._take(), self.factor()
            if operator == "*":
                value *= right
            elif right == 0:
                self.divided_by_zero, value = True, Fraction(0)
            else:
                value /= right
        return value

    def factor(self) -> Fraction:
        token = self._take()
        if token == "(":
            value = self.expr()
            if self._take() != ")":
                raise EquationError("unbalanced brackets")
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise EquationError(f"expected a number or '(' but found {token!r}")


def parse_equation(text: str) -> Equation:
    """Parse ``text`` (an optional trailing ``= <number>`` is ignored); raise :class:`EquationError` if malformed."""
    left = text.split("=", 1)[0] if text.count("=") == 1 and text.split("=", 1)[1].strip().isdigit() else text
    tokens = _tokenize(left)
    if not tokens:
        raise EquationError("the equation is empty")
    if len(tokens) > 64:
        raise EquationError("the equation is too long")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.index != len(tokens):
        raise EquationError(f"unexpected {tokens[parser.index]!r} after a complete expression")
    return Equation(None if parser.divided_by_zero else value, tuple(parser.numbers))


@dataclass(frozen=True)
class CountdownInstance:
    numbers: tuple[int, ...]
    target: int


_OPERATORS = ("+", "-", "*", "/")


def _combine(a: Fraction, b: Fraction, operator: str) -> Fraction | None:
    if operator == "+":
        return a + b
    if operator == "-":
        return a - b
    if operator == "*":
        return a * b
    return a / b if b != 0 else None


@lru_cache(maxsize=4096)
def generate_instance(
    seed: int,
    min_numbers: int = 3,
    max_numbers: int = 4,
    min_number: int = 1,
    max_number: int = 99,
    max_target: int = 99,
    max_tries: int = 10_000,
) -> CountdownInstance:
    """The instance of ``seed``: numbers and the value of a random whole-number expression over all of them."""
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        count = int(rng.integers(min_numbers, max_numbers + 1))
        numbers = [int(n) for n in rng.integers(min_number, max_number + 1, size=count)]
        pool = [Fraction(n) for n in numbers]
        while len(pool) > 1:
            i, j = (int(k) for k in rng.choice(len(pool), 2, replace=False))
            a, b = pool[i], pool[j]
            # Only steps that keep a positive whole number, like the classic game.
            values = {op: _combine(a, b, op) for op in _OPERATORS}
            options = [op for op, v in values.items() if v is not None and v > 0 and v.denominator == 1]
            if not options:
                break
            value = values[options[int(rng.integers(0, len(options)))]]
            pool = [x for k, x in enumerate(pool) if k not in (i, j)] + [value]
        if len(pool) == 1 and 1 <= pool[0] <= max_target:
            return CountdownInstance(tuple(numbers), int(pool[0]))
    raise RuntimeError(f"no Countdown instance found for seed {seed}; raise max_target or max_number")


def solve(numbers: tuple[int, ...], target: int) -> str | None:
    """An equation using every number once that equals ``target``, by exhaustive enumeration, or None."""
    goal = Fraction(target)

    def search(pool: list[tuple[Fraction, str]]) -> str | None:
        if len(pool) == 1:
            return pool[0][1] if pool[0][0] == goal else None
        for (i, (a, text_a)), (j, (b, text_b)) in permutations(enumerate(pool), 2):
            rest = [item for k, item in enumerate(pool) if k not in (i, j)]
            for operator in _OPERATORS:
                if operator in "+*" and i > j:
                    continue  # commutative: one order is enough
                value = _combine(a, b, operator)
                if value is None:
                    continue
                found = search(rest + [(value, f"({text_a} {operator} {text_b})")])
                if found is not None:
                    return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found is not None and found.startswith("(") and found.endswith(")"):
        return found[1:-1]
    return found


MAX_NUMBER = 1_000_000  # the numbers and the target: drawn as 64-bit integers, and read by the model as text


class CountdownEnv(TextEnv):
    """Countdown: one equation answer scored against the target."""

    def __init__(
        self,
        min_numbers: int = 3,
        max_numbers: int = 4,
        min_number: int = 1,
        max_number: int = 99,
        max_target: int = 99,
        correct_reward: float = 1.0,
        format_reward: float = 0.1,
        name: str = "countdown",
    ) -> None:
        if not 2 <= min_numbers <= max_numbers <= 6:
            raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 6, got {min_numbers}, {max_numbers}")
        for option, value in (("min_number", min_number), ("max_number", max_number), ("max_target", max_target)):
            bounded(option, value, 1, MAX_NUMBER)
        if not 1 <= min_number <= max_number:
            raise ValueError(f"need 1 <= min_number <= max_number, got {min_number}, {max_number}")
        bounded_reward("correct_reward", correct_reward)
        bounded_reward("format_reward", format_reward)
        self.name = name
        self.settings = (min_numbers, max_numbers, min_number, max_number, max_target)
        self.correct_reward, self.format_reward = correct_reward, format_reward
        self.instance: CountdownInstance | None = None
        self._answered: float | None = None

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.instance = generate_instance(int(seed), *self.settings)
        self._answered = None
        return self.render(), {"success": False}

    def _require_instance(self) -> CountdownInstance:
        if self.instance is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self.instance

    def parse_action(self, text: str) -> str | None:
        """The stripped equation if it parses as arithmetic over whole numbers, else None (an invalid action)."""
        try:
            parse_equation(text)
        except EquationError:
            return None
        return text.strip()

    def score(self, equation: str) -> float:
        """RAGEN's Countdown score of ``equation`` for the current instance."""
        instance = self._require_instance()
        try:
            parsed = parse_equation(equation)
        except EquationError:
            return 0.0
        if Counter(parsed.numbers) != Counter(instance.numbers):
            return 0.0
        return self.correct_reward if parsed.value == instance.target else self.format_reward

    def step(self, action: str) -> StepResult:
        self._require_instance()
        if self._answered is not None:
            raise RuntimeError("the Countdown episode is over; call reset(seed) first")
        if self.parse_action(action) is None:
            info = {"success": False, "action_is_valid": False, "action_is_effective": False}
            return self.render(), 0.0, False, False, info
        self._answered = self.score(action)
        info = {"success": self.success, "action_is_valid": True, "action_is_effective": True}
        return self.render(), float(self._answered), True, False, info

    def render(self) -> str:
        instance = self._require_instance()
        numbers = ", ".join(str(n) for n in instance.numbers)
        status = "" if self._answered is None else f"\nYour equation scored {self._answered:g}."
        return f"Target: {instance.target}\nNumbers: [{numbers}]{status}"

    @property
    def action_names(self) -> list[str]:
        return []  # the answer is a free-form equation, checked by parse_action

    def instruction(self) -> str:
        return (
            "You play Countdown. Using each of the given numbers exactly once, with +, -, *, / and brackets, "
            "write an equation whose value is the target. Answer with the equation only, for example "
            "<answer> (12 + 3) * 2 </answer>."
        )

    @property
    def success(self) -> bool:
        return self._answered is not None and self._answered == self.correct_reward

    def end_reason(self) -> str:
        """``"wrong_answer"`` when the equation did not reach the target with the given numbers, else ``"success"``."""
        return "success" if self.success else "wrong_answer"

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, max(self.correct_reward, self.format_reward)

    def success_from_reward(self, env_reward: float) -> bool | None:
        """Success is exactly the correct-answer reward."""
        return env_reward == self.correct_reward

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random well-formed equation over the numbers (random order, random operators, no brackets)."""
        numbers = list(self._require_instance().numbers)
        order = rng.permutation(len(numbers))
        text = str(numbers[order[0]])
        for k in order[1:]:
            text += f" {_OPERATORS[int(rng.integers(0, 4))]} {numbers[k]}"
        return text

    def expert_plan(self, actions_left: int) -> list[str]:
        """An equation reaching the target, found by enumeration."""
        instance = self._require_instance()
        equation = solve(instance.numbers, instance.target)
        return [equation] if equation is not None else []


@register_env("countdown")
def make_countdown(**overrides: Any) -> CountdownEnv:
    """Countdown with 3-4 numbers in 1..99 and a target in 1..99."""
    return CountdownEnv(**{"name": "countdown", **overrides})
