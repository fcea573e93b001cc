"""The one error a config raises, and how pydantic's errors are said to the user."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config that cannot be used: the message names every offending key and how to fix it."""


def config_error(location: str, problem: str) -> ConfigError:
    """The :class:`ConfigError` of one ``problem`` at ``location`` (a section such as ``algorithm``, or ``<root>``
    for the whole tree), worded as pydantic's errors are."""
    return ConfigError(f"invalid config:\n  {location}: {problem}")


def format_validation_error(error: ValidationError) -> str:
    """One line per offending key: ``key: what is wrong``."""
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `ragen config show` lists every key)"
        elif item["type"] == "missing":
            message = "required"
        lines.append(f"  {key}: {message}")
    return "invalid config:\n" + "\n".join(lines)
