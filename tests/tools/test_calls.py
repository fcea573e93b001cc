"""What a call came to, as a record the turns table stores: its text always valid UTF-8."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ragen_core.tools import CallRecord, ToolCall
from ragen_core.tools.calls import storable
from schemas.tables import TOOL_CALL


def test_text_that_is_not_utf_8_is_kept_escaped():
    name = b"report-\xff.txt".decode("utf-8", "surrogateescape")  # a file name as os.listdir reads it
    assert name == "report-\udcff.txt"
    record = CallRecord("ls", '{"folder": "\ud800"}', f"found {name}", "raised", 0.5)
    assert record.row() == {
        "name": "ls",
        "arguments": '{"folder": "\\ud800"}',
        "result": "found report-\\udcff.txt",
        "error": "raised",
        "duration_s": 0.5,
    }
    assert pa.array([record.row()], TOOL_CALL).to_pylist() == [record.row()]  # what pyarrow refused before


def test_valid_text_is_kept_as_it_is():
    assert storable("2 × 3 = 6 😀") == "2 × 3 = 6 😀" and storable(None) is None
    record = CallRecord.of(ToolCall("calculate", {"expression": "2 × 3"}), "6")
    assert (record.name, record.arguments, record.result) == ("calculate", '{"expression": "2 × 3"}', "6")


def test_an_unknown_error_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown tool error 'oops'; errors: bad_json, "):
        CallRecord("ls", "{}", "", "oops")
