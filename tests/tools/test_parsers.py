"""Tool calls in the model's chat format: the Hermes / Qwen2.5 blocks and Llama 3.1's JSON lines, read under the
strict and the lenient reading, written back, and the registry's refusal of an unknown parser."""

from __future__ import annotations

import pytest

from ragen_core.tools import TOOL_PARSERS, ToolCall, tool_parser
from ragen_core.tools.parsers import MAX_CALL_CHARS, MAX_DEPTH, read_call

NOT_UTF_8 = "holds text that is not valid UTF-8 (the lone surrogate"
CALC = '{"name": "calculate", "arguments": {"expression": "947 + 2444"}}'


def _read(text: str, think: bool = False, strict: bool = True, finished: bool = True):
    return tool_parser("hermes").read(text, think, strict, finished)


def test_a_hermes_reply_is_its_calls():
    answer = '{"name": "answer", "arguments": {"value": 3}}'
    reply = _read(f"<tool_call>\n{CALC}\n</tool_call>\n<tool_call>\n{answer}\n</tool_call>")
    assert reply.format_ok and reply.content == "" and reply.think == ""
    assert [b.call for b in reply.blocks] == [
        ToolCall("calculate", {"expression": "947 + 2444"}),
        ToolCall("answer", {"value": 3}),
    ]


def test_thinking_comes_first_when_replies_think():
    text = f"<think>add them</think>\n<tool_call>\n{CALC}\n</tool_call>"
    reply = _read(text, think=True)
    assert reply.format_ok and reply.think == "add them"
    assert not _read(f"<tool_call>\n{CALC}\n</tool_call>", think=True).format_ok  # no think block: strict refuses
    assert _read(f"<tool_call>\n{CALC}\n</tool_call>", think=True, strict=False).format_ok


def test_strict_refuses_text_around_the_calls_and_a_cut_reply_lenient_does_not():
    around = f"Let me compute. <tool_call>\n{CALC}\n</tool_call> done"
    assert not _read(around).format_ok and _read(around).content == "Let me compute.  done"
    assert _read(around, strict=False).format_ok
    assert not _read(f"<tool_call>\n{CALC}\n</tool_call>", finished=False).format_ok
    assert _read(f"<tool_call>\n{CALC}\n</tool_call>", strict=False, finished=False).format_ok
    assert not _read("The answer is 3.").format_ok and _read("The answer is 3.").blocks == []


@pytest.mark.parametrize(
    ("inside", "detail"),
    [
        ('{"name": "calculate", "arguments": {"expression": "1 + 2"}', "not valid JSON (Expecting ',' delimiter"),
        ('["calculate"]', 'not an object with a "name" string'),
        ('{"name": "calculate", "arguments": "1 + 2"}', '"arguments" is not a JSON object'),
        ('{"name": "calculate", "arguments": {}, "id": 3}', "unexpected key(s) id beside name and arguments"),
    ],
)
def test_a_block_that_does_not_parse_says_why(inside, detail):
    (block,) = _read(f"<tool_call>\n{inside}\n</tool_call>").blocks
    assert block.call is None and block.error == "bad_json" and block.detail.startswith(detail)


def test_an_unclosed_block_is_a_call_that_does_not_parse():
    reply = _read(f'<tool_call>\n{CALC}\n</tool_call>\n<tool_call>\n{{"name": "ans')
    assert [b.error for b in reply.blocks] == [None, "bad_json"]
    assert reply.blocks[1].detail == "the <tool_call> block is not closed"


@pytest.mark.parametrize("name", ["hermes", "llama3_json"])
@pytest.mark.parametrize("think", [None, "first add"])
def test_what_a_parser_writes_it_reads_back(name, think):
    calls = [ToolCall("calculate", {"expression": "(1 + 2) * 3"}), ToolCall("answer", {"value": 9})]
    parser = tool_parser(name)
    text = parser.write(calls, think)
    reply = parser.read(text, think is not None, True, True)
    assert reply.format_ok and [b.call for b in reply.blocks] == calls and reply.think == (think or "")


def test_hermes_writes_what_qwen2_5_s_template_renders_for_tool_calls():
    text = tool_parser("hermes").write([ToolCall("calculate", {"expression": "1 + 2"})], None)
    assert text == '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 2"}}\n</tool_call>'


def test_llama3_json_reads_parameters():
    reply = tool_parser("llama3_json").read('{"name": "answer", "parameters": {"value": 9}}', False, True, True)
    assert reply.format_ok and reply.blocks[0].call == ToolCall("answer", {"value": 9})


def test_an_unknown_parser_is_refused_listing_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'mistral'; registered: hermes, llama3_json"):
        tool_parser("mistral")
    assert set(TOOL_PARSERS.names()) == {"hermes", "llama3_json"}


def test_a_call_is_one_canonical_line_read_back_exactly():
    call = ToolCall("calculate", {"expression": "2 × 3"})
    assert call.text() == '{"name": "calculate", "arguments": {"expression": "2 × 3"}}'
    assert ToolCall.from_text(call.text()) == call
    assert read_call("{}") == (None, 'not an object with a "name" string')
    with pytest.raises(ValueError, match="not a tool call: not valid JSON"):
        ToolCall.from_text("calculate(1)")


@pytest.mark.parametrize(
    ("inside", "detail"),
    [
        # JSON's escapes may write a lone surrogate, which is no UTF-8 text: no table could store the call
        ('{"name":"calculate","arguments":{"expression":"\\ud800"}}', f"{NOT_UTF_8} \\ud800)"),
        ('{"name": "calc\\udfff", "arguments": {}}', f"{NOT_UTF_8} \\udfff)"),
        ('{"name": "calculate", "arguments": {"\\udc80": 1}}', f"{NOT_UTF_8} \\udc80)"),
        # what json.loads raises beside JSONDecodeError: too deep for its recursion, an integer of over 4,300 digits
        ('{"name": "answer", "arguments": {"value": ' + "[" * 50_000, "not valid JSON (nested deeper than 32 levels)"),
        (
            '{"name": "answer", "arguments": {"value": ' + "9" * 5000 + "}}",
            "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion)",
        ),
        # parsed, yet deeper than MAX_DEPTH: the call's object is level 1, its arguments 2, so 31 lists more is 33
        ('{"name": "answer", "arguments": {"value": ' + "[" * 31 + "]" * 31 + "}}", "nested deeper than 32 levels"),
        ('{"name": "answer", "arguments": {"value": "' + "x" * 100_000 + '"}}', "longer than 100,000 characters"),
    ],
)
def test_a_call_json_cannot_hold_is_bad_json_never_an_exception(inside, detail):
    (block,) = _read(f"<tool_call>\n{inside}\n</tool_call>").blocks
    assert (block.call, block.error, block.detail) == (None, "bad_json", detail)
    (line,) = tool_parser("llama3_json").read(inside.replace('"arguments"', '"parameters"'), False, True, True).blocks
    assert (line.call, line.error, line.detail) == (None, "bad_json", detail)
    with pytest.raises(ValueError, match=r"^not a tool call: "):
        ToolCall.from_text(inside)


def test_the_limits_are_where_the_docstring_says_and_what_fits_them_parses():
    assert (MAX_DEPTH, MAX_CALL_CHARS) == (32, 100_000)
    deepest = '{"name": "answer", "arguments": {"value": ' + "[" * 30 + "]" * 30 + "}}"  # 32 levels
    nested: list = []
    for _ in range(29):
        nested = [nested]  # 30 lists, one in another
    assert read_call(deepest) == (ToolCall("answer", {"value": nested}), "")
    # a surrogate pair written as escapes is one character of UTF-8 text: it parses, and its line is UTF-8
    call, problem = read_call('{"name": "answer", "arguments": {"value": "\\ud83d\\ude00"}}')
    assert (call, problem) == (ToolCall("answer", {"value": "\U0001f600"}), "")
    assert call.text().encode("utf-8") == b'{"name": "answer", "arguments": {"value": "\xf0\x9f\x98\x80"}}'
