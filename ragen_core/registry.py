"""The project's one registry: things registered by name, looked up by name.

Every name -> thing table of the project is a :class:`Registry` (advantage estimators, policy losses, filter
strategies, environments, scripted policies, findings analyses and their panels, schema upgrades). A name is
registered once (a second registration is refused, naming the first); looking up an unknown name raises a
``ValueError`` that lists the registered names.

A registered function may declare its *options*: the keyword parameters it takes from a config section, by the
section's field name (``options=("gamma", "lam")``, or ``{"grouping": "grpo_grouping"}`` where the parameter and
the field are named apart). :meth:`Registry.call` then reads them from the section the caller passes, so an option
is said twice only: at the function and at the config field. This module imports nothing of the project, so every
layer, ``schemas`` included, may import it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> thing: ``@registry.register("name")`` (or :meth:`add`) to add, ``registry.get("name")`` to look up."""

    def __init__(self, kind: str, items: Mapping[Hashable, T] | None = None) -> None:
        self.kind = kind
        self._items: dict[Hashable, T] = {}
        self._options: dict[Hashable, dict[str, str]] = {}
        for name, item in (items or {}).items():
            self.add(name, item)

    def register(self, name: Hashable, *, options: Iterable[str] | Mapping[str, str] = ()) -> Callable[[T], T]:
        """Decorator: register the decorated thing as ``name`` (with its declared config ``options``)."""

        def decorator(item: T) -> T:
            return self.add(name, item, options=options)

        return decorator

    def add(self, name: Hashable, item: T, *, options: Iterable[str] | Mapping[str, str] = ()) -> T:
        """Register ``item`` as ``name``; ``options``: its keyword parameters read from a config section, as field
        names (``{parameter: field}`` where they differ). Refuses a second ``name`` and an option ``item`` does not
        take."""
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice (first: {_label(self._items[name])})")
        declared = dict(options) if isinstance(options, Mapping) else {option: option for option in options}
        missing = sorted(set(declared) - keyword_parameters(item)) if declared else []
        if missing:
            raise ValueError(f"{self.kind} {name!r} declares option(s) {', '.join(missing)} it does not take")
        self._items[name] = item
        self._options[name] = declared
        return item

    def remove(self, name: Hashable) -> None:
        """Unregister ``name`` (a test's temporary registration)."""
        self.get(name)
        del self._items[name], self._options[name]

    __delitem__ = remove

    def get(self, name: Hashable) -> T:
        """The thing registered as ``name``; a ``ValueError`` listing the registered names when there is none."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            names = ", ".join(str(n) for n in self.names()) or "none"
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {names}") from None

    __getitem__ = get

    def options(self, name: Hashable) -> dict[str, str]:
        """The options ``name`` declared: ``{parameter: config field}``."""
        self.get(name)
        return dict(self._options[name])

    def options_from(self, name: Hashable, section: object) -> dict[str, Any]:
        """``name``'s declared options, each read from ``section`` by its field name."""
        options = {}
        for parameter, field in self.options(name).items():
            if not hasattr(section, field):
                raise ValueError(f"{self.kind} {name!r} reads option {field!r}, which {type(section).__name__} lacks")
            options[parameter] = getattr(section, field)
        return options

    def bind(self, name: Hashable, section: object) -> Callable[..., Any]:
        """The function ``name`` with its declared options read from ``section`` bound (to call many times)."""
        return functools.partial(self.get(name), **self.options_from(name, section))  # type: ignore[arg-type]

    def call(self, name: Hashable, section: object, *args: Any, **data: Any) -> Any:
        """Call ``name`` with ``args``, its declared options read from ``section``, and of the keyword ``data`` (inputs
        that only some registered functions take, such as a critic's values) those it takes. A keyword no
        registered function takes is a mistake (a typo): refused with the known ones."""
        function = self.bind(name, section)
        known = set().union(*(keyword_parameters(item) for item in self._items.values()))
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(f"unknown {self.kind} keyword(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        taken = keyword_parameters(self.get(name))
        return function(*args, **{key: value for key, value in data.items() if key in taken})

    def names(self) -> list[Any]:
        """The registered names, sorted."""
        return sorted(self._items)  # type: ignore[type-var]

    def items(self) -> list[tuple[Any, T]]:
        """(name, thing) pairs, by name."""
        return [(name, self._items[name]) for name in self.names()]

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._items
        except TypeError:  # an unhashable name is never registered
            return False

    def __iter__(self) -> Iterator[Any]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(str(n) for n in self.names())})"


def keyword_parameters(item: object) -> set[str]:
    """The parameters ``item`` (a callable) takes by keyword; none for anything else."""
    if not callable(item):
        return set()
    try:
        parameters = inspect.signature(item).parameters.values()
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {parameter.name for parameter in parameters if parameter.kind in kinds}


def _label(item: object) -> str:
    module, name = getattr(item, "__module__", None), getattr(item, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(item)
