"""Tools as data: a typed Python function as an OpenAI function schema, and a call's arguments checked against it.

A tool is a function with type hints and a docstring: ``inspect.signature`` and the hints give the parameters' JSON
schema (``str`` -> ``string``, ``int`` -> ``integer``, ``float`` -> ``number``, ``bool`` -> ``boolean``,
``list[T]`` -> ``array``, ``dict[str, T]`` -> ``object``, ``Literal[...]`` -> ``enum``, ``T | None`` -> the type or
null), the docstring's first paragraph the description, and its ``Args:`` section (Google style) or ``:param x:``
lines (Sphinx style) each argument's. A parameter without a default is required; no other argument is accepted
(the schema says ``"additionalProperties": false``). The schema is what a chat template renders with ``tools=``
(``{"type": "function", "function": {name, description, parameters}}``), and :func:`check_arguments` holds a
model's call to it, so a call of the wrong shape is the agent's error, told to it in one line, never the tool's. A
schema written elsewhere (an MCP server's ``inputSchema``) is read as JSON Schema reads it: an argument it does not
list is accepted unless its ``additionalProperties`` is false, and checked against it when it is a schema.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}
_CONTAINERS = {list: "array", dict: "object"}
_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI's function names may be: never a pattern, path or SQL
_SUPPORTED = "str, int, float, bool, list[...], dict[str, ...], Literal[...] or X | None"


@dataclass(frozen=True)
class Tool:
    """A tool the agent may call: its name, description, the JSON schema of its arguments (an object) and the
    function that runs it (called with the arguments as keywords)."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] = field(compare=False, repr=False)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, as chat templates take it in ``tools=``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def function_tool(function: Callable[..., Any], name: str | None = None) -> Tool:
    """The :class:`Tool` of a typed ``function`` (a bound method's ``self`` is not a parameter), called ``name``
    (default: the function's name): a ValueError of one line names a name that is not 1 to 64 letters, digits, ``_``
    or ``-``, a parameter without a type hint, of a type a JSON schema cannot state, or ``*args`` / ``**kwargs``."""
    label = function.__name__ if name is None else name
    if not isinstance(label, str) or not _NAME.fullmatch(label):
        raise ValueError(f"tool name {label!r}: a tool's name is 1 to 64 letters, digits, _ or - (OpenAI's rule)")
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError) as exc:
        raise ValueError(f"tool {label}: its type hints cannot be read ({exc})") from None
    description, argument_docs = docstring_parts(inspect.getdoc(function) or "")
    properties: dict[str, Any] = {}
    required = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind not in _KINDS:
            raise ValueError(f"tool {label}: *{parameter.name} cannot be described; give every argument a name")
        if parameter.name not in hints:
            raise ValueError(
                f"tool {label}: parameter {parameter.name!r} has no type hint; annotate it ({_SUPPORTED})"
            )
        schema = json_schema(hints[parameter.name], f"tool {label}: parameter {parameter.name!r}")
        if parameter.name in argument_docs:
            schema["description"] = argument_docs[parameter.name]
        properties[parameter.name] = schema
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return Tool(label, description or label, parameters, function)


def json_schema(annotation: Any, where: str = "a type") -> dict[str, Any]:
    """The JSON schema of a type hint (module docstring); a ValueError naming ``where`` for any other type."""
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal and arguments and all(type(a) in _SIMPLE for a in arguments):
        kinds = {type(a) for a in arguments}
        typed = {"type": _SIMPLE[kinds.pop()]} if len(kinds) == 1 else {}
        return {**typed, "enum": list(arguments)}
    if origin in (typing.Union, types.UnionType) and type(None) in arguments and len(arguments) == 2:
        inner = json_schema(next(a for a in arguments if a is not type(None)), where)
        return {**inner, "type": [inner["type"], "null"]} if "type" in inner else inner
    if annotation in _CONTAINERS or origin in _CONTAINERS:
        container = origin or annotation
        schema: dict[str, Any] = {"type": _CONTAINERS[container]}
        if container is list and arguments:
            schema["items"] = json_schema(arguments[0], where)
        if container is dict and len(arguments) == 2:
            if arguments[0] is not str:
                raise ValueError(f"{where}: a JSON object's keys are strings, not {arguments[0]!r}")
            schema["additionalProperties"] = json_schema(arguments[1], where)
        return schema
    raise ValueError(f"{where}: a JSON schema cannot state the type {annotation!r}; use {_SUPPORTED}")


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?):\s*$")
_GOOGLE_ARG = re.compile(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")
_SPHINX_ARG = re.compile(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.*)$")


def docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """A docstring's first paragraph (joined into one line) and the per-argument descriptions of its ``Args:``
    section or ``:param x:`` lines (continuation lines joined)."""
    lines = []
    for line in doc.strip().splitlines():  # the first paragraph, up to a section or a :param line
        if not line.strip() or _SECTION.match(line.strip()) or _SPHINX_ARG.match(line.strip()):
            break
        lines.append(line.strip())
    description = " ".join(lines)
    arguments: dict[str, str] = {}
    current, in_args = None, False
    for line in doc.splitlines():
        section = _SECTION.match(line.strip())
        if section:
            in_args, current = section.group(1) in ("Args", "Arguments", "Parameters"), None
            continue
        found = _SPHINX_ARG.match(line.strip()) or (_GOOGLE_ARG.match(line) if in_args else None)
        if found:
            current = found.group(1)
            arguments[current] = found.group(2).strip()
        elif current is not None and line.strip() and (in_args or line.startswith(" ")):
            arguments[current] = f"{arguments[current]} {line.strip()}".strip()
        elif not line.strip():
            current = None
    return description, arguments


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """What is wrong with ``arguments`` (a model's call of ``tool``, parsed from JSON) for the tool's schema, in one
    line, or None when they fit: an object, every required argument given, each of its type, and no other where the
    schema's ``additionalProperties`` is false (another is checked against it when it is a schema, else accepted)."""
    if not isinstance(arguments, dict):
        return f"{tool.name}: the arguments must be a JSON object, got {_shown(arguments)}"
    properties = tool.parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    missing = [name for name in tool.parameters.get("required", []) if name not in arguments]
    if missing:
        return f"{tool.name}: missing argument(s) {', '.join(missing)}"
    others = tool.parameters.get("additionalProperties", True)
    unknown = sorted(set(arguments) - set(properties))
    if unknown and others is False:
        return f"{tool.name}: unknown argument(s) {', '.join(unknown)}; it takes {', '.join(properties) or 'none'}"
    for name, value in arguments.items():
        problem = value_problem(properties.get(name, others), value)
        if problem is not None:
            return f"{tool.name}: argument {name!r} {problem}"
    return None


def value_problem(schema: dict[str, Any] | bool, value: Any) -> str | None:
    """Why ``value`` does not fit ``schema`` (the subset :func:`json_schema` writes; ``false`` accepts no value,
    ``true`` or anything else but an object every value), or None."""
    if schema is False:
        return f"is not accepted, got {_shown(value)}"
    if not isinstance(schema, dict):
        return None
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {', '.join(map(repr, schema['enum']))}, got {_shown(value)}"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if kinds and not any(_is_kind(value, kind) for kind in kinds):
        return f"must be {' or '.join(_ARTICLE.get(kind, kind) for kind in kinds)}, got {_shown(value)}"
    if isinstance(value, list) and "items" in schema:
        for item in value:
            problem = value_problem(schema["items"], item)
            if problem is not None:
                return f"has an item that {problem}"
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for item in value.values():
            problem = value_problem(schema["additionalProperties"], item)
            if problem is not None:
                return f"has a value that {problem}"
    return None


_ARTICLE = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    checks = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}
    return kind in checks and isinstance(value, checks[kind])


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


__all__ = ["Tool", "check_arguments", "docstring_parts", "function_tool", "json_schema", "value_problem"]
