"""The environment protocol shared by every text environment, and the registry that builds them by name.

Environments are Gymnasium-style: ``reset(seed) -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``, where ``action`` is one canonical action
name (the agent layer parses replies, splits multi-action turns and enforces budgets, the same for every env).
``info`` always carries ``success``, ``action_is_valid`` and ``action_is_effective``.
"""

from __future__ import annotations

import inspect
import math
import re
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragen_core.registry import Registry

StepResult = tuple[str, float, bool, bool, dict[str, Any]]

# Bounds of the numbers an env takes as options (``env.options``), as every number of the config is bounded: a typo
# (a board side of 1e9, a step limit of 10**12) is refused in one line when the config loads, never found as a
# memory blow-up mid-rollout. Env-specific bounds (a Sokoban room's side, its boxes) sit in the env's own module.
MAX_ENV_STEPS = 10_000  # an episode's step limit; the config's turn and action budgets end episodes sooner
MAX_ENV_REWARD = 1_000_000.0  # a reward or penalty's magnitude, as the config's coefficients


def bounded(option: str, value: Any, low: float, high: float, *, integer: bool = True) -> Any:
    """``value`` when it is a number from ``low`` to ``high`` (a whole number when ``integer``); else a ValueError
    naming the option, its bounds and the value given (booleans, nan and infinities are refused)."""
    number = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not number or (isinstance(value, float) and not math.isfinite(value)):
        number = False
    if not (number and low <= value <= high):
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."  # 10**400 is 401 digits
        raise ValueError(
            f"{option} must be {'a whole number' if integer else 'a number'} from {low:g} to {high:g}, got {shown}"
        )
    return value


def bounded_reward(option: str, value: Any) -> float:
    """A reward or penalty option: a finite number of magnitude at most :data:`MAX_ENV_REWARD`."""
    return float(bounded(option, value, -MAX_ENV_REWARD, MAX_ENV_REWARD, integer=False))


@dataclass(frozen=True)
class Tile:
    """How one kind of cell of a grid state is drawn: the character the env renders it as, its name (a lower-case
    word: the drawn tile's class), its colour (``#rrggbb``) and what it is in words (the prompt's legend, the drawn
    tile's tooltip)."""

    symbol: str
    name: str
    colour: str
    label: str

    def __post_init__(self) -> None:
        if len(self.symbol) != 1 or self.symbol.isspace():
            raise ValueError(f"a tile's symbol is one visible character, got {self.symbol!r}")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", self.name):
            raise ValueError(f"a tile's name is a lower-case word (letters, digits and '-'), got {self.name!r}")
        if not re.fullmatch(r"#[0-9a-fA-F]{6}", self.colour):
            raise ValueError(f"a tile's colour is written #rrggbb, got {self.colour!r}")


def legend_text(legend: Sequence[Tile]) -> str:
    """A grid legend in words, as a prompt states it: ``symbol: label, ...`` in the legend's order."""
    return ", ".join(f"{tile.symbol}: {tile.label}" for tile in legend)


def legend_symbols(legend: Sequence[Tile]) -> str:
    """A grid legend's symbols, in its order (what an env with a legend declares as its ``grid_symbols``)."""
    return "".join(tile.symbol for tile in legend)


class TextEnv(ABC):
    """A seeded, text-rendered environment. Subclasses set ``name`` and implement the abstract methods."""

    name: str = "base"
    # How a grid state is drawn (FrozenLake, Sokoban): one Tile per kind of cell. `ragen view` draws an observation's
    # rows made only of these symbols as a board of these tiles; empty for envs whose state is not a grid (shown as
    # text). An env with a legend declares its symbols as grid_symbols (legend_symbols; tests/envs/test_legend.py).
    grid_legend: tuple[Tile, ...] = ()
    # Characters of the cells of a grid state (FrozenLake, Sokoban): the tiny model's tokenizer never merges two of
    # them, so every cell is one token (ragen_core/policy/tiny.py). Empty for envs whose state is not a grid.
    grid_symbols: str = ""
    # Whether an instance is a map from a small space that two seeds can draw alike (Sokoban rooms, FrozenLake lakes):
    # validation then holds out maps, not only seeds (ragen_core/envs/held_out.py, config eval.held_out).
    held_out_maps: bool = False

    @abstractmethod
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Start the instance determined by ``seed``; return the rendered state and an info dict."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one canonical action name; invalid names leave the state unchanged with ``action_is_valid`` False."""

    @abstractmethod
    def render(self) -> str:
        """The current state as text (the env's own symbols, docs/environments.md)."""

    @property
    @abstractmethod
    def action_names(self) -> list[str]:
        """Canonical action names, in the order the prompt lists them."""

    @abstractmethod
    def instruction(self) -> str:
        """The rules and symbol legend shown in the first prompt (may depend on the instance)."""

    def map_key(self) -> str:
        """The identity of the instance just reset: the same for every seed that draws the same map, whatever the
        symbols or format it is shown in (default: the rendered state)."""
        return self.render()

    def brief(self) -> str:
        """The rules in one line, for ``rollout.prompt_style=compact`` (default: the whole :meth:`instruction`)."""
        return self.instruction()

    def describe(self) -> str | None:
        """A sentence of what the current state shows (perception only: no action, plan or value), which the
        ``describe_random`` scripted policy writes as its thinking; None for envs that have none."""
        return None

    @property
    @abstractmethod
    def success(self) -> bool:
        """Whether the current instance counts as solved."""

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        """Lowest and highest total env reward a trajectory of ``max_actions`` actions can collect."""
        raise NotImplementedError(f"{type(self).__name__} does not declare its reward bounds")

    def end_reason(self) -> str:
        """Why the env ended the episode, asked once a step returned ``terminated``: ``"success"`` when solved, else
        ``"failure"``; an env that knows how it was lost names it (FrozenLake's ``"hole"``). Stored as the
        trajectory's ``end_reason`` (the rollout names the other ends: turns, actions, format, token limit)."""
        return "success" if self.success else "failure"

    def user_code(self, action: str) -> str | None:
        """The user's own code a step with ``action`` would run, named for its errors (the dataset env's reward
        function on its row), or None: a built-in env's step runs only this project's code. The rollouts run a step
        that names one under ``env.user_code_timeout_s``; an env class of the user's own is always run so."""
        return None

    def success_from_reward(self, env_reward: float) -> bool | None:
        """Whether a trajectory with this total env reward must be a success (True), must not be (False), or None
        when the reward does not imply it (the default). The data contracts check stored rows against it."""
        return None

    def parse_action(self, text: str) -> str | None:
        """The canonical action named by one answer item, or None if it names none.

        Default: a case-insensitive match against :attr:`action_names`. Envs whose actions are free-form (an
        equation in Countdown) override this.
        """
        lookup = {name.lower(): name for name in self.action_names}
        return lookup.get(text.strip().lower())

    def sample_action(self, rng: np.random.Generator) -> str:
        """One uniformly random valid action (the ``random`` scripted policy)."""
        names = self.action_names
        return names[int(rng.integers(0, len(names)))]

    def expert_plan(self, actions_left: int) -> list[str]:
        """The scripted expert's next actions from the current state, given the trajectory's remaining budget.

        Deterministic envs return a whole plan (the rollout layer cuts it to the turn's limit and asks again next
        turn); stochastic envs return one action, so the expert re-plans after every observation.
        """
        raise NotImplementedError(f"environment {self.name!r} has no scripted expert")

    def teacher_actions(self, actions_left: int) -> list[str] | None:
        """Every best next action from the current state, ties included, in :attr:`action_names` order; None for
        envs without a teacher. The ``teacher_mix`` scripted policy draws among them, and the rollout engine stores
        whether each reply's first action is one of them (the teacher-agreement diagnostic)."""
        return None


EnvFactory = Callable[..., TextEnv]
_REGISTRY: Registry[EnvFactory] = Registry("environment")
# Names that were given up, and what to use instead (told when one is asked for).
RENAMED_ENVS = {
    "sudoku_9x9": "renamed sudoku_pr147_9x9 (RAGEN-2's superseded PR #147 Sudoku); RAGEN-2's current Sudoku, 9x9, is "
    "sudoku",
}


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Register ``factory`` (a class or function taking keyword overrides) under ``name``."""
    return _REGISTRY.register(name)


def registered_envs() -> list[str]:
    """Names of the environments this project registers, sorted (:func:`make_env` also takes installed
    distributions' names and import paths: :func:`available_envs`)."""
    return _REGISTRY.names()


def available_envs() -> list[str]:
    """Every environment name :func:`make_env` takes besides an import path: this project's, then those that
    installed distributions register (entry points of ``ragen.envs``; a name this project registers stays its)."""
    from ragen_core.envs.external import entry_point_envs

    return registered_envs() + sorted(set(entry_point_envs()) - set(registered_envs()))


def env_factory(name: str, what: str = "env.name") -> EnvFactory:
    """The factory of environment ``name``: registered here, by an installed distribution (entry point of
    ``ragen.envs``) or ``package.module:Class``; a ``ValueError`` of one line naming ``what`` (the key) otherwise."""
    if name in _REGISTRY:
        return _REGISTRY.get(name)
    if name in RENAMED_ENVS:
        raise ValueError(
            f"{what}: unknown environment {name!r} ({name} was {RENAMED_ENVS[name]}); registered: "
            f"{', '.join(registered_envs())}"
        )
    from ragen_core.envs.external import entry_point_envs, external_env_class, is_import_path

    if is_import_path(name) or name in entry_point_envs():
        return external_env_class(name, what)
    raise ValueError(
        f"{what}: unknown environment {name!r}; registered: {', '.join(available_envs())} (or your own: "
        "package.module:Class)"
    )


def accepted_options(factory: EnvFactory) -> list[str] | None:
    """The option names ``factory`` (an env class, or a function passing ``**overrides`` on to the class its return
    annotation names) takes, sorted; None when that cannot be told (a ``**kwargs`` of its own, no annotation)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            target = typing.get_type_hints(factory).get("return") if inspect.isfunction(factory) else None
            if not (isinstance(target, type) and issubclass(target, TextEnv)):
                return None
            parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError, NameError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return sorted(p.name for p in parameters if p.kind in kinds)


def make_env(name: str, **overrides: Any) -> TextEnv:
    """Build the environment ``name`` (:func:`env_factory`); ``overrides`` replace its default settings. An option
    it does not take is a ``ValueError`` of one line naming the unknown option(s) and the ones it takes."""
    factory = env_factory(name)
    try:
        return factory(**overrides)
    except TypeError as exc:
        accepted = accepted_options(factory)
        unknown = sorted(set(overrides) - set(accepted)) if accepted is not None else []
        if not unknown:  # raised inside the env (a value of the wrong type, say): its own words
            raise ValueError(f"environment {name!r} cannot be built with options {sorted(overrides)}: {exc}") from None
        takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
        raise ValueError(
            f"environment {name!r} does not take the option(s) {', '.join(unknown)} ({takes}): remove or rename "
            f"env.options.{unknown[0]}"
        ) from None
