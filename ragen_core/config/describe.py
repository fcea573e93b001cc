"""Every key of a config, dotted, with its value, its default and its description: what ``ragen config show`` prints.

Read from the pydantic fields themselves (the sections' fields, walked recursively), so a key added to a section is
listed with the description written on its ``Field``, and nothing here repeats them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from ragen_core.config.algorithm import PRESETS, AlgorithmConfig
from ragen_core.config.tree import RunConfig


@dataclass(frozen=True)
class KeyDoc:
    """One key of the config: its dotted name, the value it has, the value it takes when left out, and what it does.
    Values are plain JSON values (as the config's ``to_dict`` holds them)."""

    key: str
    value: Any
    default: Any
    description: str


def describe_keys(config: RunConfig) -> list[KeyDoc]:
    """Every leaf key of ``config``, in the order the sections declare them. A key the algorithm's preset sets takes
    that preset's value when left out: its default is the one of ``config``'s own preset."""
    return list(_walk(config, ""))


def _walk(section: BaseModel, prefix: str) -> list[KeyDoc]:
    """The leaf keys of one section; a field holding a section is walked into."""
    keys: list[KeyDoc] = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            keys.extend(_walk(value, f"{prefix}{name}."))
            continue
        default = _default(section, name, field)
        keys.append(KeyDoc(f"{prefix}{name}", to_jsonable_python(value), default, field.description or ""))
    return keys


def _default(section: BaseModel, name: str, field: FieldInfo) -> Any:
    """The value ``name`` takes when left out of ``section``: the preset's for a key of the algorithm it sets."""
    if isinstance(section, AlgorithmConfig) and name in PRESETS[section.preset]:
        return to_jsonable_python(PRESETS[section.preset][name])
    default = field.get_default(call_default_factory=True)
    return None if default is PydanticUndefined else to_jsonable_python(default)
