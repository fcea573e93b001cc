"""What every config section shares: frozen, no unknown keys, no inf/nan, booleans only where a key takes one."""

from __future__ import annotations

from collections.abc import Iterator
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# Every count of the config (iterations, instances, groups, tokens, ...) is at most a million: a larger one is a typo
# (10**12 iterations) that would otherwise pass validation and fail, or run for ever, after the run was created.
MAX_COUNT = 1_000_000
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
MAX_NEW_TOKENS = 131_072  # longer than any model's context here: a larger reply limit is a mistake
# Seeds are 32-bit (numpy's legacy range, torch's and vLLM's seeds hold them): seed=1e29 or a negative seed (which
# abs() would make the same run as its positive twin) is a mistake, refused when the config loads.
MAX_SEED = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
# No learning rate of AdamW is above 10, and no coefficient, clip, bound or multiplier of the config above a million:
# a larger value is a typo (1e308) that would pass and then overflow or wreck the run after it was created.
MAX_LR = 10.0
MAX_SCALE = 1e6
LearningRate = Annotated[float, Field(gt=0, le=MAX_LR)]
Scale = Annotated[float, Field(ge=0, le=MAX_SCALE)]


class Section(BaseModel):
    """A config section: frozen, unknown keys refused, inf and nan refused, booleans kept apart from numbers."""

    # inf and nan are no setting of any key (actor.lr=inf would pass and fail at the first update)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Pydantic would read ``true`` as 1 for a number and ``1`` as true for a boolean, and YAML reads ``yes``,
        ``no``, ``on`` and ``off`` as booleans: a boolean key takes only true/false, no other key takes them."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None or value is None:
            return value
        leaves = leaf_types(field.annotation)
        takes_bool = bool in leaves or Any in leaves
        if isinstance(value, bool) and not takes_bool:
            kind = "a number" if leaves & {int, float} else "text" if str in leaves else "another type"
            fix = "write the number" if kind == "a number" else 'quote the word (e.g. "yes")' if kind == "text" else ""
            raise ValueError(
                f"got the boolean {str(value).lower()} (YAML also reads yes/no/on/off as booleans), but this key "
                f"takes {kind}{': ' + fix if fix else ''}"
            )
        if takes_bool and leaves - {type(None)} == {bool} and not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {value!r}")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _text_is_one_printable_line(cls, value: Any) -> Any:
        """A text value (a path, a name) is one line of printable text: a newline, an escape sequence or another
        control character in one would reach logs, Prefect's UI and terminals as something else than it says. Texts
        nested in a list or a mapping (``env.options``: its keys too) are held to the same rule."""
        for text in _texts(value):
            bad = next((c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
            if bad is not None:
                shown = repr(text) if len(text) <= 200 else f"{text[:200]!r}..."
                raise ValueError(
                    f"{shown} holds the control character {bad!r} (at {text.index(bad)}): a text value of the "
                    "config is one line of printable characters"
                )
        return value


def _texts(value: Any) -> Iterator[str]:
    """Every text in ``value``: itself, or those nested in its lists, tuples and mappings (keys and values)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(key)
            yield from _texts(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _texts(item)


def leaf_types(annotation: Any) -> set[Any]:
    """The plain types an annotation accepts: unions and Optional unpacked, Literal values as their types."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return set().union(*(leaf_types(arg) for arg in get_args(annotation)))
    if origin is Literal:
        return {type(arg) for arg in get_args(annotation)}
    if origin is Annotated:
        return leaf_types(get_args(annotation)[0])
    return {origin or annotation}
