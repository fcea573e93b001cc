"""One token path: a table of stored trajectories becomes flat arrays once (:class:`TokenRows`), and every batch, the
padded log-probs and the turn rows cut from them equal, bit for bit, what the list path makes of the same rows as
Python lists (:func:`collate`, and the turn rows and their sampled entropy cut here by hand with plain loops), for
every shape of table the lake hands out (several chunks, a slice, windowed rows with segment lengths, rows
without)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_core.training.batch import collate
from ragen_core.training.turn_rows import sampled_turn_entropy
from ragen_core.update.rows import TokenBatch, TokenRows, TurnRows


def _row(draw, windowed: bool, all_windowed: bool) -> dict:
    length = draw(st.integers(1, 24))
    ids = draw(st.lists(st.integers(0, 5000), min_size=length, max_size=length))
    mask = draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
    logprobs = [float(np.float32(-x)) for x in draw(st.lists(st.floats(0, 20), min_size=length, max_size=length))]
    segments = None
    if windowed and (all_windowed or draw(st.booleans())):
        cuts = sorted(draw(st.sets(st.integers(1, length - 1), max_size=3))) if length > 1 else []
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
def tables(draw, all_windowed: bool = False) -> pa.Table:
    windowed = all_windowed or draw(st.booleans())
    rows = [_row(draw, windowed, all_windowed) for _ in range(draw(st.integers(1, 9)))]
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


def _padded(values: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for row, row_values in enumerate(values):
        out[row, : len(row_values)] = torch.tensor(row_values, dtype=torch.float32)
    return out


@settings(max_examples=150, deadline=None)
@given(tables(), st.integers(0, 7), st.data())
def test_any_run_of_rows_collates_bit_for_bit_as_its_rows_as_lists(table, pad, data):
    lists = [table[name].to_pylist() for name in ("input_ids", "loss_mask", "segment_lengths", "behavior_logprobs")]
    rows = TokenRows.from_table(table, logprobs=True)
    assert len(rows) == table.num_rows and rows.lengths.tolist() == [len(ids) for ids in lists[0]]
    expected = collate(*lists[:2], pad, lists[2])
    _same(rows.batch(pad), expected)
    start = data.draw(st.integers(0, len(rows) - 1))
    stop = data.draw(st.integers(start + 1, len(rows)))
    part = collate(lists[0][start:stop], lists[1][start:stop], pad, lists[2][start:stop])
    _same(rows.batch(pad, start, stop), part)
    width = part.loss_mask.shape[1]
    assert torch.equal(rows.padded_logprobs(width, start, stop), _padded(lists[3][start:stop], width))
    assert [r.tolist() for r in rows.id_rows()] == lists[0] and [r.tolist() for r in rows.mask_rows()] == lists[1]


def _turns_by_hand(table: pa.Table) -> tuple[list, list, list, list, list]:
    """The turn rows cut with plain loops: ids, masks, log-probs, trajectory, turn."""
    ids, masks, logprobs, trajectory, turn = [], [], [], [], []
    columns = ("input_ids", "loss_mask", "segment_lengths", "behavior_logprobs")
    rows = zip(*(table[c].to_pylist() for c in columns), strict=True)
    for row, (row_ids, row_mask, segments, row_logprobs) in enumerate(rows):
        start = 0
        for index, length in enumerate(segments):
            ids.append(row_ids[start : start + length])
            masks.append(row_mask[start : start + length])
            logprobs.append(row_logprobs[start : start + length])
            trajectory.append(row)
            turn.append(index)
            start += length
    return ids, masks, logprobs, trajectory, turn


@settings(max_examples=100, deadline=None)
@given(tables(all_windowed=True), st.integers(0, 7))
def test_turn_rows_and_their_sampled_entropy_equal_a_cut_by_hand(table, pad):
    ids, masks, logprobs, trajectory, turn = _turns_by_hand(table)
    turns, rows_of, turn_of = TokenRows.from_table(table, logprobs=True).turns()
    assert rows_of.tolist() == trajectory and turn_of.tolist() == turn
    assert [r.tolist() for r in turns.id_rows()] == ids and [r.tolist() for r in turns.mask_rows()] == masks
    expected = collate(ids, masks, pad)
    _same(turns.batch(pad), expected)
    width = expected.loss_mask.shape[1]
    assert torch.equal(turns.padded_logprobs(width), _padded(logprobs, width))
    entropy = sampled_turn_entropy(TurnRows(turns, rows_of, turn_of))
    for row, (row_mask, row_logprobs) in enumerate(zip(masks, logprobs, strict=True)):
        chosen = [-value for value, trained in zip(row_logprobs, row_mask, strict=True) if trained]
        assert entropy[row].item() == pytest.approx(sum(chosen) / max(len(chosen), 1), rel=1e-12, abs=1e-12)


def test_a_table_without_segment_lengths_and_the_refusals():
    table = pa.table(
        {
            "input_ids": pa.array([[3, 4, 5], [6]], pa.list_(pa.int32())),
            "loss_mask": pa.array([[0, 1, 1], [1]], pa.list_(pa.int8())),
        }
    )
    rows = TokenRows.from_table(table)
    batch = rows.batch(pad_id=9)
    assert batch.input_ids.tolist() == [[3, 4, 5], [6, 9, 9]] and batch.position_ids is None
    assert batch.loss_mask.tolist() == [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]  # column 0 never trains
    assert rows.batch(9, 1, 2).input_ids.tolist() == [[6]]  # as wide as its own rows
    assert rows.padded_logprobs(3) is None
    short = table.set_column(1, "loss_mask", pa.array([[0, 1, 1], [1, 1]], pa.list_(pa.int8())))
    with pytest.raises(ValueError, match="row 1: 1 token ids but 2 loss-mask entries"):
        TokenRows.from_table(short)
    with pytest.raises(ValueError, match=r"row 1: segment lengths \[2, 2\] do not split its 3 tokens"):
        TokenRows.of([[1, 2], [3, 4, 5]], [[0, 1], [0, 1, 1]], [[2], [2, 2]])
    with pytest.raises(ValueError, match=r"row 0: segment lengths \[2, 0\] do not split its 2 tokens"):
        TokenRows.of([[1, 2]], [[0, 1]], [[2, 0]])
    with pytest.raises(ValueError, match="not a non-empty run"):
        rows.batch(0, 1, 1)
    assert TokenRows.of([], []).id_rows() == []


def test_packed_positions_restart_per_sequence_and_the_padding_continues_the_last():
    rows = TokenRows.of([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]], [[1, 1, 1, 1, 1], [1] * 6], [[3, 2], None])
    batch = rows.batch(0)
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 1]]  # a sequence's first token: no context
