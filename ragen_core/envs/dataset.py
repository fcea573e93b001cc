"""The dataset environment: verifiable-reward prompts from a file, scored by the user's reward function.

The way TRL users bring a task: a Parquet or JSONL file of prompts (``data_file``; one column, ``prompt_column``, is
the prompt, every other column is passed to the reward) and a reward function named ``package.module:function``
(``reward_fn``). An instance is a row (``reset(seed)`` takes row ``seed % rows``); the answer is free-form (what the
reply's ``<answer>`` holds). The function is called as ``reward(completion, **columns)`` and returns the score, or
``(score, feedback)``: an answer scoring at least ``success_reward`` solves the instance and ends the episode; any
other is shown its feedback (default: its score) as the next turn's state, under the prompt, while turns are left
(``env.max_turns``). Every score lies in ``reward_range`` (checked: the data contracts bound stored rewards by it).

With an ``answer_column`` (a reference answer per row) the env has a scripted expert and teacher (that answer) and a
random policy (the answer of a random row: well-formed, mostly wrong): the bootstrap's ``expert`` and
``teacher_mix`` policies work on it. A task whose wrong answers another row's answer would not stand for (another
row's sum is a plausible wrong sum; another row's proof is not a wrong proof of this one) names its own
``wrong_answer_fn``, ``package.module:function`` called as ``wrong(rng, **columns)`` (the row's columns but the
prompt, and the policy's ``numpy.random.Generator``, its only source of chance) and returning the answer text. Settings
are ``env.options``; ``data_file``, ``reward_fn`` and ``wrong_answer_fn`` are keys a config read back from the data
root may not set unless the user names them again (:mod:`ragen_core.config.trust`).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ragen_core.envs.base import StepResult, TextEnv, register_env
from ragen_core.envs.external import (
    FUNCTION_EXAMPLE,
    UserCodeError,
    as_number,
    failure,
    guarded_call,
    import_object,
    shown,
)
from ragen_core.envs.watchdog import Watchdog

DATASET_ENV = "dataset"
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
DEFAULT_INSTRUCTION = "Answer the question. Put only the final answer inside <answer> </answer>."
MAX_ROWS = 10_000_000


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a Parquet or JSONL file, as plain Python values."""
    if path.suffix.lower() in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(  # the decoder's own position counts lines within the line: its column only
                    f"env.options.data_file: line {number} of {str(path)!r} is not JSON: {exc.msg} at column "
                    f"{exc.colno}"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"env.options.data_file: line {number} of {str(path)!r} is not a JSON object")
            rows.append(row)
    return rows


@lru_cache(maxsize=8)
def _cached_rows(path: str, stamp: tuple[int, int]) -> tuple[dict[str, Any], ...]:
    """The rows of ``path`` as of ``stamp`` (its modification time and size): rollouts build an env per trajectory,
    the file is read once."""
    return tuple(_read_rows(Path(path)))


def load_rows(data_file: str, prompt_column: str) -> tuple[dict[str, Any], ...]:
    """The rows of ``data_file`` (Parquet or JSONL), each holding a text ``prompt_column``; a ``ValueError`` of one
    line otherwise."""
    path = Path(data_file).expanduser()
    suffixes = PARQUET_SUFFIXES + JSONL_SUFFIXES
    if path.suffix.lower() not in suffixes:
        raise ValueError(
            f"env.options.data_file: {data_file!r} is neither Parquet nor JSONL (name it *{', *'.join(suffixes)})"
        )
    if not path.is_file():
        raise ValueError(f"env.options.data_file: {data_file!r} is not a file")
    stat = path.stat()
    try:
        rows = _cached_rows(str(path.resolve()), (stat.st_mtime_ns, stat.st_size))
    except OSError as exc:
        raise ValueError(f"env.options.data_file: cannot read {data_file!r}: {exc.strerror or exc}") from None
    except Exception as exc:  # pyarrow's errors on a damaged file: one line naming it
        if str(exc).startswith("env.options.data_file: "):  # a JSONL line's own error, said once
            raise ValueError(str(exc)) from None
        raise ValueError(f"env.options.data_file: cannot read {data_file!r}: {' '.join(str(exc).split())}") from None
    if not rows or len(rows) > MAX_ROWS:
        raise ValueError(f"env.options.data_file: {data_file!r} holds {len(rows)} rows (1 to {MAX_ROWS})")
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get(prompt_column), str) or not row[prompt_column].strip():
            raise ValueError(
                f"env.options.prompt_column: row {number} of {data_file!r} has no text column {prompt_column!r} "
                f"(its columns: {', '.join(sorted(row))})"
            )
    return rows


def load_reward(reward_fn: str, columns: list[str]) -> Callable[..., Any]:
    """The reward function ``reward_fn`` names, checked to take ``(completion, **columns)``; a ``ValueError`` of one
    line otherwise (before any rollout)."""
    return _load_function("reward_fn", reward_fn, columns, "reward(completion", "answer")


def load_wrong_answer(wrong_answer_fn: str, columns: list[str]) -> Callable[..., Any]:
    """The function ``wrong_answer_fn`` names, checked to take ``(rng, **columns)``; a ``ValueError`` of one line
    otherwise (before any rollout)."""
    return _load_function("wrong_answer_fn", wrong_answer_fn, columns, "wrong(rng", None)


def _load_function(key: str, name: str, columns: list[str], call: str, first: Any) -> Callable[..., Any]:
    """The function ``name`` (the value of ``env.options.<key>``) names, checked to take ``first`` and the row's
    ``columns`` as keywords (``call``: how its call begins, for the message)."""
    function = import_object(name, f"env.options.{key}", FUNCTION_EXAMPLE)
    if not callable(function):
        raise ValueError(f"env.options.{key}: {name!r} is not a function")
    try:
        inspect.signature(function).bind(first, **dict.fromkeys(columns))
    except TypeError as exc:
        raise ValueError(
            f"env.options.{key}: {name!r} cannot be called as {call}, {', '.join(f'{c}=...' for c in columns)}): {exc}"
        ) from None
    except ValueError:  # a builtin without a signature: called as it is
        pass
    return function


class DatasetEnv(TextEnv):
    """Prompts from a Parquet / JSONL file, answers scored by a reward function; one or several turns."""

    def __init__(
        self,
        data_file: str | None = None,
        reward_fn: str | None = None,
        prompt_column: str = "prompt",
        answer_column: str | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        success_reward: float = 1.0,
        reward_range: tuple[float, float] | list[float] = (0.0, 1.0),
        wrong_answer_fn: str | None = None,
        name: str = DATASET_ENV,
    ) -> None:
        if not data_file or not reward_fn:
            raise ValueError(
                "the dataset env needs env.options.data_file (a Parquet or JSONL file) and "
                "env.options.reward_fn (package.module:function)"
            )
        low, high = (float(v) for v in reward_range)
        if not low <= high or not low <= success_reward <= high:
            raise ValueError(
                f"env.options.reward_range {list(reward_range)} must be [low, high] holding "
                f"success_reward={success_reward}"
            )
        self.name, self.data_file = name, data_file
        self.rows = load_rows(data_file, prompt_column)
        self.prompt_column, self.answer_column = prompt_column, answer_column
        if answer_column is not None and any(answer_column not in row for row in self.rows):
            raise ValueError(
                f"env.options.answer_column: {answer_column!r} is not a column of every row of {data_file!r}"
            )
        columns = sorted({key for row in self.rows for key in row} - {prompt_column})
        self.reward_fn, self.reward = reward_fn, load_reward(reward_fn, columns)
        self.wrong_answer_fn = wrong_answer_fn
        self.wrong = None if wrong_answer_fn is None else load_wrong_answer(wrong_answer_fn, columns)
        self.text, self.success_reward, self.reward_range = instruction, float(success_reward), (low, high)
        self.row: dict[str, Any] | None = None
        self.row_number = 0  # the row's number in the file, from 1
        self.feedback: str | None = None
        self.solved = False

    def _require_row(self) -> dict[str, Any]:
        if self.row is None:
            raise RuntimeError("call reset(seed) before using the environment")
        return self.row

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.row_number = int(seed) % len(self.rows) + 1
        self.row = self.rows[self.row_number - 1]
        self.feedback, self.solved = None, False
        return self.render(), {"success": False, "row": int(seed) % len(self.rows)}

    def parse_action(self, text: str) -> str | None:
        """The answer as written (stripped); None when empty."""
        return text.strip() or None

    def _reward_call(self, answer: str) -> str:
        """The reward function's call on ``answer`` and the current row, named for its errors."""
        where = f"row {self.row_number} of {self.data_file}, answer {shown(answer, 40)}"
        return f"reward function {self.reward_fn} on {where}"

    def user_code(self, action: str) -> str | None:
        """A step with an answer calls the reward function (named with its row and the answer); an empty one
        does not."""
        answer = self.parse_action(action)
        return None if answer is None or self.row is None or self.solved else self._reward_call(answer)

    def score(self, answer: str) -> tuple[float, str]:
        """(score, feedback) of ``answer`` by the reward function, checked: a finite number within ``reward_range``
        (numpy's numbers taken as Python's); a :class:`~ragen_core.envs.external.UserCodeError` of one line naming the
        function, the row and the answer when it raises (``sys.exit`` included) or returns anything else."""
        row = self._require_row()
        columns = {key: value for key, value in row.items() if key != self.prompt_column}
        called = self._reward_call(answer) + ","
        try:
            result = self.reward(answer, **columns)
        except (Exception, SystemExit) as exc:  # sys.exit in the user's function is its error, never the process's
            raise failure(called, exc) from exc
        score, feedback = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
        number = as_number(score)
        if number is None:
            raise UserCodeError(f"{called} returned {shown(result)}: return a number, or (number, feedback text)")
        if not math.isfinite(number):
            raise UserCodeError(f"{called} returned {shown(result)}: a score is a finite number")
        low, high = self.reward_range
        if not low <= number <= high:
            raise UserCodeError(f"{called} returned {number:g}, outside env.options.reward_range [{low:g}, {high:g}]")
        return number, str(feedback) if feedback is not None else f"Your answer scored {number:g}."

    def check_reward(self, rows: int = 3, timeout_s: float | None = None) -> None:
        """Score the first ``rows`` rows' reference answers (``answer_column``) with the reward function, each call
        within ``timeout_s`` (``env.user_code_timeout_s``), and draw a wrong answer for each with ``wrong_answer_fn``,
        before any compute: a function that raises, does not return or returns what it must not is a ``ValueError``
        of one line (``env.options.reward_fn: ...``). Without an answer column the reward function is not called."""
        with Watchdog(timeout_s) as watchdog:
            for seed in range(min(rows, len(self.rows))):
                self._check_row(seed, watchdog)
        self.row, self.row_number = None, 0

    def _check_row(self, seed: int, watchdog: Watchdog) -> None:
        """:meth:`check_reward` of row ``seed``."""
        self.reset(seed)
        try:
            if self.answer_column is not None:
                answer = self._answer(self._require_row())
                guarded_call(self._reward_call(answer), self.score, answer, watchdog)
        except UserCodeError as exc:
            raise ValueError(f"env.options.reward_fn: {exc} (the row's {self.answer_column!r} scored)") from None
        try:
            if self.wrong is not None:
                self.sample_action(np.random.default_rng(seed))
        except UserCodeError as exc:
            raise ValueError(f"env.options.wrong_answer_fn: {exc}") from None

    def step(self, action: str) -> StepResult:
        self._require_row()
        if self.solved:
            raise RuntimeError("the episode is over; call reset(seed) first")
        answer = self.parse_action(action)
        if answer is None:
            info = {"success": False, "action_is_valid": False, "action_is_effective": False}
            return self.render(), 0.0, False, False, info
        reward, self.feedback = self.score(answer)
        self.solved = reward >= self.success_reward
        info = {"success": self.solved, "action_is_valid": True, "action_is_effective": True}
        return self.render(), reward, self.solved, False, info

    def render(self) -> str:
        prompt = str(self._require_row()[self.prompt_column])
        return prompt if self.feedback is None else f"{prompt}\nFeedback: {self.feedback}"

    @property
    def action_names(self) -> list[str]:
        return []  # free-form answers, read by parse_action

    def instruction(self) -> str:
        return self.text

    @property
    def success(self) -> bool:
        return self.solved

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        low, high = self.reward_range
        return min(0.0, low * max_actions), max(0.0, high * max_actions)

    def _answer(self, row: dict[str, Any]) -> str:
        if self.answer_column is None:
            raise ValueError("the dataset env's scripted policies play env.options.answer_column: set it")
        return str(row[self.answer_column]).strip()

    def sample_action(self, rng: np.random.Generator) -> str:
        """The ``random`` scripted policy's answer: ``wrong_answer_fn``'s for the current row when it is set (a
        :class:`~ragen_core.envs.external.UserCodeError` when it raises or returns no text), else the reference
        answer of a random row (well-formed, mostly wrong)."""
        if self.wrong is None:
            return self._answer(self.rows[int(rng.integers(0, len(self.rows)))])
        row = self._require_row()
        columns = {key: value for key, value in row.items() if key != self.prompt_column}
        called = f"wrong-answer function {self.wrong_answer_fn} on row {self.row_number} of {self.data_file}"
        try:
            answer = self.wrong(rng, **columns)
        except (Exception, SystemExit) as exc:
            raise failure(called, exc) from exc
        if not isinstance(answer, str) or not answer.strip():
            raise UserCodeError(f"{called} returned {shown(answer)}: return the answer's text")
        return answer.strip()

    def expert_plan(self, actions_left: int) -> list[str]:
        """The row's reference answer (``answer_column``)."""
        return [self._answer(self._require_row())]

    def teacher_actions(self, actions_left: int) -> list[str] | None:
        """The row's reference answer, when the file has an ``answer_column``."""
        return None if self.answer_column is None else [self._answer(self._require_row())]


@register_env(DATASET_ENV)
def make_dataset_env(**options: Any) -> DatasetEnv:
    """Prompts from ``data_file``, scored by ``reward_fn`` (module docstring)."""
    return DatasetEnv(**{"name": DATASET_ENV, **options})
