"""One token path: a table of stored trajectories becomes a batch straight from Arrow's buffers
(:func:`collate_table`), equal bit for bit to :func:`collate` of the same rows as Python lists, for every shape of
table the lake hands out (several chunks, a slice, windowed rows with segment lengths, rows without); the stored
behaviour log-probs pad the same way (:func:`padded_values`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_core.training.batch import TokenBatch, collate, collate_table, padded_values


def _row(draw, windowed: bool) -> dict:
    length = draw(st.integers(1, 24))
    ids = draw(st.lists(st.integers(0, 5000), min_size=length, max_size=length))
    mask = draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
    logprobs = [float(np.float32(-x)) for x in draw(st.lists(st.floats(0, 20), min_size=length, max_size=length))]
    segments = None
    if windowed and length > 1 and draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, length - 1), max_size=3)))
        segments = [b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True)]
    return {"input_ids": ids, "loss_mask": mask, "segment_lengths": segments, "behavior_logprobs": logprobs}


SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("segment_lengths", pa.list_(pa.int32())),
        ("behavior_logprobs", pa.list_(pa.float32())),
    ]
)


@st.composite
def tables(draw) -> pa.Table:
    windowed = draw(st.booleans())
    rows = [_row(draw, windowed) for _ in range(draw(st.integers(1, 9)))]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    split = draw(st.integers(0, len(rows)))  # two chunks, as a lake read of two part files hands them out
    table = pa.concat_tables([table.slice(0, split), table.slice(split)])
    start = draw(st.integers(0, len(rows) - 1))
    return table.slice(start, draw(st.integers(1, len(rows) - start)))


def _same(a: TokenBatch, b: TokenBatch) -> None:
    for name in ("input_ids", "attention_mask", "loss_mask"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.position_ids is None) == (b.position_ids is None)
    if a.position_ids is not None:
        assert torch.equal(a.position_ids, b.position_ids)


@settings(max_examples=150, deadline=None)
@given(tables(), st.integers(0, 7))
def test_a_table_collates_bit_for_bit_as_its_rows_as_lists(table, pad):
    lists = [table[name].to_pylist() for name in ("input_ids", "loss_mask", "segment_lengths")]
    expected = collate(*lists[:2], pad, lists[2])
    _same(collate_table(table, pad), expected)
    logprobs = padded_values(table["behavior_logprobs"], expected.loss_mask.shape[1])
    by_hand = torch.zeros_like(logprobs)
    for row, values in enumerate(table["behavior_logprobs"].to_pylist()):
        by_hand[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(logprobs, by_hand)


def test_a_table_without_segment_lengths_and_the_refusals():
    table = pa.table(
        {
            "input_ids": pa.array([[3, 4, 5], [6]], pa.list_(pa.int32())),
            "loss_mask": pa.array([[0, 1, 1], [1]], pa.list_(pa.int8())),
        }
    )
    batch = collate_table(table, pad_id=9)
    assert batch.input_ids.tolist() == [[3, 4, 5], [6, 9, 9]] and batch.position_ids is None
    assert batch.loss_mask.tolist() == [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]  # column 0 never trains
    short = table.set_column(1, "loss_mask", pa.array([[0, 1, 1], [1, 1]], pa.list_(pa.int8())))
    with pytest.raises(ValueError, match="row 1: 1 token ids but 2 loss-mask entries"):
        collate_table(short, pad_id=0)
    assert padded_values(pa.chunked_array([pa.array([[0.5], None], pa.list_(pa.float32()))]), 3) is None
