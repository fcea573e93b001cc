"""Stored token rows as flat arrays: the one way stored trajectories (or their turns) become tensors.

A ``trajectories`` table holds each row's token ids, loss mask, sampler log-probs and (windowed rows) segment lengths
as Arrow list columns. :class:`TokenRows` takes their flat value buffers once (no Python object per token) with each
row's start, and everything the update, offline re-training, the per-turn rows and the diagnostics need is cut from
those arrays: a padded :class:`TokenBatch` of any run of rows, the padded log-probs, the turn rows of windowed
trajectories (the same flat arrays, partitioned at the segment boundaries instead of the row boundaries), one row's
ids as a numpy view. Each result equals, bit for bit, what :func:`~ragen_core.training.batch.collate` makes of the
same rows as Python lists (tests/training/test_token_rows.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

FULL_CONTEXT = (
    "is one full-context sequence (no segment_lengths), so it has no turn rows: per-turn training rows need a "
    "windowed rollout.context_window_mode (limited_multi_turn or single_turn); set "
    "rollout.training_rows=trajectory for full-context runs"
)


@dataclass
class TokenBatch:
    """Right-padded trajectories. ``loss_mask[b, t]`` marks tokens the policy produced (trained on);
    position t's log-prob is that of ``input_ids[b, t]`` given the tokens before it (column 0 is always 0).

    ``position_ids`` is set when some row packs several independent sequences (the windowed context modes): the
    positions restart at 0 at each sequence, and the model then attends only within a sequence (see
    :func:`model_inputs`)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float
    position_ids: torch.Tensor | None = None  # (B, T) long, packed rows only

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TokenBatch:
        """The same batch on ``device`` (itself when it is already there); ``non_blocking``: the host does not wait
        for a copy to a GPU (safe from pageable memory, which is staged at once)."""
        tensors = [self.input_ids, self.attention_mask, self.loss_mask, self.position_ids]
        moved = [t.to(device, non_blocking=non_blocking) if t is not None else None for t in tensors]
        return TokenBatch(*moved)

    def select(self, rows: torch.Tensor | list[int]) -> TokenBatch:
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(dim=1).max())
        positions = self.position_ids[rows, :width] if self.position_ids is not None else None
        return TokenBatch(
            self.input_ids[rows, :width], self.attention_mask[rows, :width], self.loss_mask[rows, :width], positions
        )


@dataclass(frozen=True)
class TokenRows:
    """Rows of tokens back to back: row b is ``ids[offsets[b]:offsets[b + 1]]`` (its loss mask and log-probs alike).

    ``segments`` lists every row's sequences' lengths back to back, ``counts[b]`` how many are row b's: a packed row
    (a windowed trajectory) has one per turn, any other row one, its whole length; ``packed[b]`` tells them apart."""

    ids: np.ndarray  # (N,) int64
    mask: np.ndarray  # (N,) the stored 0/1 loss mask
    offsets: np.ndarray  # (B + 1,) int64
    segments: np.ndarray  # (S,) int64
    counts: np.ndarray  # (B,) int64, each >= 1
    packed: np.ndarray  # (B,) bool
    logprobs: np.ndarray | None = None  # (N,) float32; None when some row has none (scripted rows)

    @classmethod
    def from_table(cls, table: pa.Table, logprobs: bool = False) -> TokenRows:
        """The rows of a table's ``input_ids``, ``loss_mask`` and (when present) ``segment_lengths`` columns, and with
        ``logprobs`` its ``behavior_logprobs`` (None when a row has none). Refuses a row whose loss mask or segment
        lengths do not match its tokens, naming it."""
        lengths = _lengths(table["input_ids"])
        mask_lengths = _lengths(table["loss_mask"])
        if not np.array_equal(lengths, mask_lengths):
            row = int(np.flatnonzero(lengths != mask_lengths)[0])
            raise ValueError(f"row {row}: {lengths[row]} token ids but {mask_lengths[row]} loss-mask entries")
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = _values(table["input_ids"]).astype(np.int64)
        mask = _values(table["loss_mask"])
        segments, counts, packed = _segments(table, lengths)
        values = None
        if logprobs and table["behavior_logprobs"].null_count == 0:
            values = _values(table["behavior_logprobs"]).astype(np.float32)
        return cls(ids, mask, offsets, segments, counts, packed, values)

    @classmethod
    def of(
        cls,
        input_ids: Sequence[Sequence[int]],
        loss_masks: Sequence[Sequence[int]],
        segment_lengths: Sequence[Sequence[int] | None] | None = None,
        behavior_logprobs: Sequence[Sequence[float] | None] | None = None,
    ) -> TokenRows:
        """:meth:`from_table` of rows given as Python lists (tests, hand-made rows): the same path."""
        columns = {
            "input_ids": pa.array(input_ids, pa.list_(pa.int64())),
            "loss_mask": pa.array(loss_masks, pa.list_(pa.int8())),
            "segment_lengths": pa.array(segment_lengths or [None] * len(input_ids), pa.list_(pa.int64())),
            "behavior_logprobs": pa.array(behavior_logprobs or [None] * len(input_ids), pa.list_(pa.float32())),
        }
        return cls.from_table(pa.table(columns), logprobs=behavior_logprobs is not None)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """(B,) each row's token count."""
        return np.diff(self.offsets)

    def id_rows(self) -> list[np.ndarray]:
        """Each row's token ids (views of the flat array)."""
        return np.split(self.ids, self.offsets[1:-1]) if len(self) else []

    def mask_rows(self) -> list[np.ndarray]:
        """Each row's loss mask (views of the flat array)."""
        return np.split(self.mask, self.offsets[1:-1]) if len(self) else []

    def batch(self, pad_id: int, start: int = 0, stop: int | None = None) -> TokenBatch:
        """Rows ``start`` to ``stop`` (all by default) right-padded with ``pad_id`` into a :class:`TokenBatch` as wide
        as their longest, the loss mask's column 0 cleared (it has no context). When one of them is packed, every row
        gets position ids that restart at each of its sequences (the padding continues the last one's count) and
        the loss mask is cleared at each sequence's first token."""
        stop = len(self) if stop is None else stop
        if len(self) == 0:
            raise ValueError("no rows to collate")
        if not 0 <= start < stop <= len(self):
            raise ValueError(f"rows {start}..{stop} are not a non-empty run of the {len(self)} rows")
        lengths = self.lengths[start:stop]
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        width = int(lengths.max())
        rows, columns = _positions(lengths)
        ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
        ids[rows, columns] = torch.from_numpy(self.ids[first:last])
        attention = torch.zeros_like(ids)
        attention[rows, columns] = 1
        mask = torch.zeros(ids.shape, dtype=torch.float32)
        mask[rows, columns] = torch.from_numpy(self.mask[first:last].astype(np.float32))
        mask[:, 0] = 0.0
        if not self.packed[start:stop].any():
            return TokenBatch(ids, attention, mask)
        return TokenBatch(ids, attention, mask, self._packed_positions(start, stop, width, mask))

    def padded_logprobs(self, width: int, start: int = 0, stop: int | None = None) -> torch.Tensor | None:
        """(rows, ``width``) float32: the stored log-probs of rows ``start`` to ``stop``, right-padded with 0 (like
        the loss mask); None without them."""
        if self.logprobs is None:
            return None
        stop = len(self) if stop is None else stop
        out = torch.zeros((stop - start, width), dtype=torch.float32)
        rows, columns = _positions(self.lengths[start:stop])
        out[rows, columns] = torch.from_numpy(self.logprobs[self.offsets[start] : self.offsets[stop]])
        return out

    def turns(self) -> tuple[TokenRows, np.ndarray, np.ndarray]:
        """(turn rows, trajectory, turn): every packed row cut at its segments into one row per turn (its window
        prompt and reply), in (row, turn) order, the same flat arrays with the segment boundaries as row
        boundaries; ``trajectory[i]`` is turn row i's row here and ``turn[i]`` its turn within it. A row that is not
        packed is refused: its turns share one sequence."""
        if not self.packed.all():
            raise ValueError(f"row {int(np.flatnonzero(~self.packed)[0])} {FULL_CONTEXT}")
        offsets = np.concatenate([[0], np.cumsum(self.segments)]).astype(np.int64)
        trajectory = np.repeat(np.arange(len(self)), self.counts)
        turn = np.arange(len(self.segments)) - np.repeat(np.cumsum(self.counts) - self.counts, self.counts)
        ones = np.ones(len(self.segments), dtype=np.int64)
        rows = TokenRows(self.ids, self.mask, offsets, self.segments, ones, np.zeros(len(ones), bool), self.logprobs)
        return rows, trajectory, turn

    def _packed_positions(self, start: int, stop: int, width: int, mask: torch.Tensor) -> torch.Tensor:
        """(rows, width) position ids restarting at each sequence of rows ``start`` to ``stop``; clears ``mask`` at
        every sequence's first token but a row's first."""
        first_segment = np.concatenate([[0], np.cumsum(self.counts)])
        segments = self.segments[first_segment[start] : first_segment[stop]]
        counts, lengths = self.counts[start:stop], self.lengths[start:stop]
        rows, columns = _positions(lengths)
        sequence_start = np.repeat(np.cumsum(segments) - segments, segments)  # each token's sequence's first token
        tail = segments[np.cumsum(counts) - 1]  # each row's last sequence's length
        positions = torch.arange(width).repeat(len(lengths), 1) - torch.from_numpy(lengths - tail)[:, None]
        positions[rows, columns] = torch.from_numpy(np.arange(len(rows)) - sequence_start)
        later = np.ones(len(segments), dtype=bool)
        later[np.cumsum(counts) - counts] = False  # a row's first sequence starts at column 0
        segment_row = np.repeat(np.arange(len(lengths)), counts)
        segment_column = (np.cumsum(segments) - segments) - np.repeat(np.cumsum(lengths) - lengths, counts)
        mask[torch.from_numpy(segment_row[later]), torch.from_numpy(segment_column[later])] = 0.0
        return positions


@dataclass(frozen=True)
class TurnRows:
    """The turn rows of some trajectory rows, in (trajectory, turn) order: ``tokens`` (their log-probs only when every
    trajectory row was sampled by the policy); ``trajectory[i]`` is the position of turn row i's trajectory among
    the rows cut, ``turn[i]`` its turn within it."""

    tokens: TokenRows
    trajectory: np.ndarray
    turn: np.ndarray


def turn_rows_of_table(rows: pa.Table) -> TurnRows:
    """Each stored windowed ``trajectories`` row cut at its ``segment_lengths`` into one row per turn (its window
    prompt and its reply; :meth:`TokenRows.turns`), with the behaviour log-probs only when every row was sampled by
    the policy (``behavior_source = 'policy'``). A full-context row (no segments) is refused: its turns share one
    sequence."""
    tokens, trajectory, turn = TokenRows.from_table(rows, logprobs=policy_sampled(rows)).turns()
    return TurnRows(tokens, trajectory, turn)


def policy_sampled(table: pa.Table) -> bool:
    """Whether every row of ``table`` was sampled by the policy (``behavior_source = 'policy'``), so has the sampler's
    log-probs (scripted rows have none: the batch then has no stored behaviour log-probs)."""
    return table.num_rows > 0 and pc.all(pc.equal(table["behavior_source"], "policy")).as_py()


def _segments(table: pa.Table, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segments, counts, packed) of a table's rows (:class:`TokenRows`), checked to split each row's tokens."""
    packed = np.zeros(len(lengths), dtype=bool)
    if "segment_lengths" in table.column_names:
        packed = ~table["segment_lengths"].is_null().to_numpy(zero_copy_only=False)
    if not packed.any():
        return lengths.copy(), np.ones(len(lengths), dtype=np.int64), packed
    column = table["segment_lengths"]
    stored = _values(column).astype(np.int64)  # the packed rows' segment lengths back to back
    stored_counts = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    counts = np.where(packed, stored_counts, 1)
    at = np.cumsum(counts) - counts  # each row's first segment
    segments = np.empty(int(counts.sum()), dtype=np.int64)
    segments[at[~packed]] = lengths[~packed]
    mine = stored_counts[packed]
    segments[np.repeat(at[packed], mine) + np.arange(len(stored)) - np.repeat(np.cumsum(mine) - mine, mine)] = stored
    owner = np.repeat(np.arange(len(lengths)), counts)
    smallest = np.ones(len(lengths), dtype=np.int64)
    np.minimum.at(smallest, owner, segments)
    bad = np.flatnonzero((np.bincount(owner, weights=segments, minlength=len(lengths)) != lengths) | (smallest < 1))
    if len(bad):
        row = int(bad[0])
        given = segments[at[row] : at[row] + counts[row]].tolist()
        raise ValueError(f"row {row}: segment lengths {given} do not split its {lengths[row]} tokens")
    return segments, counts, packed


def _lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)


def _values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return pc.list_flatten(column).to_numpy(zero_copy_only=False)


def _positions(lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) of every value of rows of ``lengths``, in the order the flat values list them."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return torch.from_numpy(rows), torch.from_numpy(np.arange(len(rows)) - starts)
