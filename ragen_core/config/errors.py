"""The one error a config raises, and how pydantic's errors are said to the user."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config that cannot be used: the message names every offending key and how to fix it."""


def config_error(location: str, problem: str) -> ConfigError:
    """The :class:`ConfigError` of one ``problem`` at ``location`` (a section such as ``algorithm``, or ``<root>``
    for the whole tree), worded as pydantic's errors are. A problem that already names its key (``env.name: ...``,
    ``algorithm.filter_ratio=1.5: ...``) is not prefixed again."""
    named = location == "<root>" or problem.startswith(f"{location}.")
    return ConfigError(f"invalid config:\n  {problem if named else f'{location}: {problem}'}")


def format_validation_error(error: ValidationError) -> str:
    """One line per offending key: ``key: what is wrong``."""
    lines = []
    items = error.errors()
    # a preset that is not one leaves the keys it would have set unset: those "required" lines follow from it
    bad_presets = {item["loc"][:-1] for item in items if item["loc"][-1:] == ("preset",) and item["type"] != "missing"}
    for item in items:
        if item["type"] == "missing" and item["loc"][:-1] in bad_presets:
            continue
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `ragen config show` lists every key)"
        elif item["type"] == "missing":
            message = "required"
        lines.append(f"  {key}: {message}")
    return "invalid config:\n" + "\n".join(lines)
