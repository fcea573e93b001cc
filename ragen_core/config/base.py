"""What every config section shares: frozen, no unknown keys, no inf/nan, booleans only where a key takes one."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# Every count of the config (iterations, instances, groups, tokens, ...) is at most a million: a larger one is a typo
# (10**12 iterations) that would otherwise pass validation and fail, or run for ever, after the run was created.
MAX_COUNT = 1_000_000
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
MAX_NEW_TOKENS = 131_072  # longer than any model's context here: a larger reply limit is a mistake


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
