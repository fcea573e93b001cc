"""Name -> function registries for advantage estimators, policy losses and group filters."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A small registry: ``@registry.register("name")`` to add, ``registry.get("name")`` to look up."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}") from None

    def options(self, name: str) -> set[str]:
        """The keyword options the function ``name`` declares (parameters with a default)."""
        return _keyword_options(self.get(name))

    def call(self, name: str, *args: Any, **options: Any) -> Any:
        """Call ``name`` with ``args`` and, of ``options``, those it declares: the caller may hold one set of options
        for every registered function (the config's), and each takes its own. An option that no registered function
        declares is a mistake (a typo): refused with the known names."""
        known = set().union(*(_keyword_options(fn) for fn in self._items.values()))
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown {self.kind} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        accepted = self.options(name)
        return self.get(name)(*args, **{key: value for key, value in options.items() if key in accepted})

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


def _keyword_options(fn: Callable) -> set[str]:
    return {
        parameter.name
        for parameter in inspect.signature(fn).parameters.values()
        if parameter.default is not inspect.Parameter.empty
        and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
