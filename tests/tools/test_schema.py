"""A typed function as an OpenAI function schema, and a call's arguments held to it: the schemas written out by
hand, the refusals in one line."""

from __future__ import annotations

from typing import Literal

import pytest

from ragen_core.tools import Tool, check_arguments, function_tool
from ragen_core.tools.schema import docstring_parts


def search(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast", tags: list[str] | None = None) -> str:
    """Search the index for a query.

    Returns the best hits, one per line.

    Args:
        query: the words to look for
        limit: how many hits at most,
            counted after filtering
        tags: only hits with these tags
    """
    return query


def weigh(grams: float, scale: dict[str, float], strict: bool) -> float:
    """Weigh something.

    :param grams: the weight
    :param strict: refuse estimates
    """
    return grams


def test_a_typed_function_becomes_the_schema_written_by_hand():
    assert function_tool(search).schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index for a query.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "the words to look for"},
                    "limit": {"type": "integer", "description": "how many hits at most, counted after filtering"},
                    "mode": {"type": "string", "enum": ["fast", "exact"]},
                    "tags": {
                        "type": ["array", "null"],
                        "items": {"type": "string"},
                        "description": "only hits with these tags",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
    weighing = function_tool(weigh, name="scale")
    assert weighing.name == "scale" and weighing.description == "Weigh something."
    assert weighing.parameters == {
        "type": "object",
        "properties": {
            "grams": {"type": "number", "description": "the weight"},
            "scale": {"type": "object", "additionalProperties": {"type": "number"}},
            "strict": {"type": "boolean", "description": "refuse estimates"},
        },
        "required": ["grams", "scale", "strict"],
        "additionalProperties": False,
    }


def test_a_bound_method_leaves_self_out():
    class Box:
        def put(self, item: str) -> str:
            """Put an item in the box."""
            return item

    assert list(function_tool(Box().put).parameters["properties"]) == ["item"]


def test_a_docstring_without_sections_is_all_description():
    assert docstring_parts("Add two numbers.\n\nMore words here.") == ("Add two numbers.", {})
    assert docstring_parts("") == ("", {})


def _untyped(x, y: int) -> int:  # noqa: ANN001 - the case under test
    return y


def _variadic(*values: int) -> int:
    return 0


def _opaque(x: complex) -> int:
    return 0


def _int_keys(x: dict[int, str]) -> int:
    return 0


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (_untyped, "tool _untyped: parameter 'x' has no type hint; annotate it"),
        (_variadic, "tool _variadic: *values cannot be described"),
        (_opaque, "tool _opaque: parameter 'x': a JSON schema cannot state the type <class 'complex'>"),
        (_int_keys, "tool _int_keys: parameter 'x': a JSON object's keys are strings"),
    ],
)
def test_what_a_schema_cannot_state_is_refused_in_one_line(function, message):
    with pytest.raises(ValueError) as caught:
        function_tool(function)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"query": "cats"}, None),
        ({"query": "cats", "limit": 3, "mode": "exact", "tags": None}, None),
        ({"query": "cats", "tags": ["a", "b"]}, None),
        ([1, 2], "search: the arguments must be a JSON object, got [1, 2]"),
        ({}, "search: missing argument(s) query"),
        ({"query": "cats", "colour": "red"}, "search: unknown argument(s) colour; it takes query, limit, mode, tags"),
        ({"query": 7}, "search: argument 'query' must be a string, got 7"),
        ({"query": "cats", "limit": 2.5}, "search: argument 'limit' must be an integer, got 2.5"),
        ({"query": "cats", "limit": True}, "search: argument 'limit' must be an integer, got True"),
        ({"query": "cats", "mode": "slow"}, "search: argument 'mode' must be one of 'fast', 'exact', got 'slow'"),
        ({"query": "cats", "tags": ["a", 3]}, "search: argument 'tags' has an item that must be a string, got 3"),
        ({"query": "cats", "tags": "a"}, "search: argument 'tags' must be an array or null, got 'a'"),
    ],
)
def test_a_call_is_held_to_the_schema(arguments, problem):
    assert check_arguments(function_tool(search), arguments) == problem


def test_an_integer_is_a_number_and_a_boolean_is_not():
    weighing = function_tool(weigh)
    assert check_arguments(weighing, {"grams": 3, "scale": {"kg": 1}, "strict": False}) is None
    assert check_arguments(weighing, {"grams": False, "scale": {}, "strict": False}) == (
        "weigh: argument 'grams' must be a number, got False"
    )
    assert check_arguments(weighing, {"grams": 1, "scale": {"kg": "x"}, "strict": True}) == (
        "weigh: argument 'scale' has a value that must be a number, got 'x'"
    )


@pytest.mark.parametrize("name", ["", "a b", "x'; DROP TABLE turns; --", "../up", "n" * 65, "tool.*"])
def test_a_name_outside_openai_s_rule_is_refused(name):
    with pytest.raises(ValueError) as caught:
        function_tool(_int_keys, name=name)
    assert str(caught.value) == (
        f"tool name {name!r}: a tool's name is 1 to 64 letters, digits, _ or - (OpenAI's rule)"
    )
    assert function_tool(search, name="web-search_2").name == "web-search_2"


def _listed(parameters):
    """A tool whose schema was written elsewhere (an MCP server's inputSchema), as listed."""
    return Tool("fetch", "Fetch a page.", parameters, lambda **arguments: "")


@pytest.mark.parametrize(
    ("parameters", "arguments", "problem"),
    [
        # JSON Schema: a key the schema does not list is accepted, unless additionalProperties is false
        ({"type": "object", "additionalProperties": True}, {"url": "a", "depth": 2}, None),
        ({"type": "object"}, {"url": "a"}, None),
        ({"type": "object", "properties": {"url": {"type": "string"}}}, {"url": "a", "depth": 2}, None),
        (
            {"type": "object", "properties": {"url": {"type": "string"}}},
            {"url": 3},
            ("fetch: argument 'url' must be a string, got 3"),
        ),
        (
            {"type": "object", "properties": {"url": {"type": "string"}}, "additionalProperties": False},
            {"url": "a", "depth": 2},
            "fetch: unknown argument(s) depth; it takes url",
        ),
        (
            {"type": "object", "additionalProperties": False},
            {"depth": 2},
            "fetch: unknown argument(s) depth; it takes none",
        ),
        # additionalProperties as a schema: the other keys are held to it
        ({"type": "object", "additionalProperties": {"type": "integer"}}, {"depth": 2}, None),
        (
            {"type": "object", "additionalProperties": {"type": "integer"}},
            {"depth": "2"},
            ("fetch: argument 'depth' must be an integer, got '2'"),
        ),
        # a schema of true accepts any value, false none
        ({"type": "object", "properties": {"url": True, "depth": False}}, {"url": [1]}, None),
        (
            {"type": "object", "properties": {"url": True, "depth": False}},
            {"depth": 1},
            ("fetch: argument 'depth' is not accepted, got 1"),
        ),
        ({"type": "object", "properties": "url", "required": ["url"]}, {}, "fetch: missing argument(s) url"),
    ],
)
def test_a_listed_schema_is_read_as_json_schema_reads_it(parameters, arguments, problem):
    assert check_arguments(_listed(parameters), arguments) == problem


def test_a_function_s_schema_refuses_other_arguments():
    assert function_tool(search).parameters["additionalProperties"] is False
    assert check_arguments(function_tool(search), {"query": "cats", "colour": "red"}) == (
        "search: unknown argument(s) colour; it takes query, limit, mode, tags"
    )
