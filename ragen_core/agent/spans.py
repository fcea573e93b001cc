"""Spans of a reply's tokens: where its thinking ends (token ids and a ``decode``, no model).

The reply format is ``<think>..</think><answer>..</answer>``; with RAGEN's reply prefix the ``<think>`` tag ends the
prompt, so a generated reply starts inside its thinking. Token boundaries need not fall on the tag (a BPE token may
carry ``.</`` or ``></answer``), so the cut is found on decoded text, not on token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

TokenIds = tuple[int, ...]
THINK_END = "</think>"


def reasoning_tokens(reply: TokenIds, decode: Callable[[list[int]], str] | None) -> TokenIds:
    """The reasoning part of a reply: its shortest prefix whose text contains ``</think>`` (the ``<think>`` block,
    tags included; the token that completes the tag may carry a character or two after it; what follows is the
    answer), or the whole reply when it has no ``</think>`` (thinking off, a reply cut before its tag) or ``decode``
    is None. Decoded text grows with the prefix, so a binary search finds the cut in log2(len) decodes."""
    if decode is None or THINK_END not in decode(list(reply)):
        return reply
    low, high = 1, len(reply)  # invariant: the prefix of length ``high`` contains the tag
    while low < high:
        middle = (low + high) // 2
        if THINK_END in decode(list(reply[:middle])):
            high = middle
        else:
            low = middle + 1
    return reply[:high]


def think_mask(
    input_ids: Sequence[Sequence[int]], loss_mask: Sequence[Sequence[float]], decode: Callable[[list[int]], str]
) -> np.ndarray:
    """(B, T) 1.0 on the thinking tokens of every reply of every row, 0.0 elsewhere: each maximal run of trained
    tokens (``loss_mask`` > 0) is one reply, and its first ``len(reasoning_tokens(reply))`` tokens are thinking (all
    of it when the reply never closes its think block). ``T`` is the widest row; rows are right-padded with 0."""
    width = max((len(row) for row in loss_mask), default=0)
    out = np.zeros((len(loss_mask), width), dtype=np.float32)
    for row, (ids, mask) in enumerate(zip(input_ids, loss_mask, strict=True)):
        trained = np.asarray(mask, dtype=np.float64)[: len(ids)] > 0
        edges = np.flatnonzero(np.diff(np.concatenate(([0], trained.astype(np.int8), [0]))))
        for start, end in zip(edges[::2], edges[1::2], strict=True):
            reply = tuple(int(t) for t in ids[start:end])
            out[row, start : start + len(reasoning_tokens(reply, decode))] = 1.0
    return out


__all__ = ["THINK_END", "reasoning_tokens", "think_mask"]
