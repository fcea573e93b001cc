"""Per-turn training rows (``rollout.training_rows: turn``): RAGEN-2's samples in its context-window modes.

In the windowed context modes a trajectory's stored row packs one sequence per turn (that turn's window prompt, mask
0, then its reply, mask 1) back to back, with ``segment_lengths``. RAGEN-2 (``ragen/llm_agent/ctx_manager.py``,
``_build_single_turn_samples`` / ``_build_limited_multi_turn_samples``) trains each turn as its own sample carrying
the episode's reward on its last token, so the update's rows are turns: the loss aggregation and the mini-batches
count turn rows. This module cuts the stored rows into those turn rows. Nothing is re-tokenised or rebuilt: each turn
row is exactly the token ids the policy was prompted with and sampled at that turn, with the sampler's stored
log-probs of them, so the lake's rows stay the only source of truth (a resume replays the same rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch


@dataclass(frozen=True)
class TurnRows:
    """The turn rows of some trajectory rows, in (trajectory, turn) order; ``trajectory[i]`` is the position of turn
    row i's trajectory among the rows cut, ``turn[i]`` its turn within it."""

    input_ids: list[list[int]]
    loss_mask: list[list[int]]
    behavior_logprobs: list[list[float]] | None  # None when some trajectory row has none (scripted rows)
    trajectory: list[int]
    turn: list[int]


def split_turn_rows(
    input_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    segment_lengths: Sequence[Sequence[int] | None],
    behavior_logprobs: Sequence[Sequence[float] | None] | None = None,
) -> TurnRows:
    """Cut each packed trajectory row at its ``segment_lengths`` into one row per turn (its window prompt and its
    reply). A row without segments (a full-context row) cannot be cut: its turns share one sequence."""
    ids_out: list[list[int]] = []
    mask_out: list[list[int]] = []
    logp_out: list[list[float]] | None = [] if behavior_logprobs is not None else None
    trajectory: list[int] = []
    turn: list[int] = []
    for row, (ids, mask, lengths) in enumerate(zip(input_ids, loss_masks, segment_lengths, strict=True)):
        if lengths is None:
            raise ValueError(
                f"row {row} is one full-context sequence (no segment_lengths), so it has no turn rows: per-turn "
                "training rows need a windowed rollout.context_window_mode (limited_multi_turn or single_turn); "
                "set rollout.training_rows=trajectory for full-context runs"
            )
        if sum(lengths) != len(ids) or len(mask) != len(ids):
            raise ValueError(f"row {row}: segment lengths {list(lengths)} do not split its {len(ids)} tokens")
        logprobs = behavior_logprobs[row] if behavior_logprobs is not None else None
        if logp_out is not None and logprobs is None:
            logp_out = None  # one row without log-probs: the batch has none (as stored_behavior_logprobs)
        start = 0
        for index, length in enumerate(lengths):
            ids_out.append(list(ids[start : start + length]))
            mask_out.append(list(mask[start : start + length]))
            if logp_out is not None and logprobs is not None:
                logp_out.append(list(logprobs[start : start + length]))
            trajectory.append(row)
            turn.append(index)
            start += length
    return TurnRows(ids_out, mask_out, logp_out, trajectory, turn)


def turn_rows_of_table(rows: pa.Table) -> TurnRows:
    """:func:`split_turn_rows` of stored ``trajectories`` rows; behaviour log-probs only when every row was sampled
    by the policy (``behavior_source = 'policy'``)."""
    policy = rows.num_rows > 0 and pc.all(pc.equal(rows["behavior_source"], "policy")).as_py()
    logprobs = rows["behavior_logprobs"].to_pylist() if policy else None
    return split_turn_rows(
        rows["input_ids"].to_pylist(), rows["loss_mask"].to_pylist(), rows["segment_lengths"].to_pylist(), logprobs
    )


def padded_logprobs(turns: TurnRows, width: int) -> torch.Tensor | None:
    """(rows, ``width``) the turn rows' stored log-probs right-padded with 0 (like the loss mask); None without."""
    if turns.behavior_logprobs is None:
        return None
    out = torch.zeros((len(turns.behavior_logprobs), width), dtype=torch.float32)
    for row, values in enumerate(turns.behavior_logprobs):
        out[row, : len(values)] = torch.as_tensor(values, dtype=torch.float32)
    return out


def mean_over_turns(turn_values: torch.Tensor, trajectory: Sequence[int], trajectories: int) -> torch.Tensor:
    """(``trajectories``,) float64: the mean of each trajectory's turn-row values (RAGEN-2's episode entropy in its
    turn-level modes: the mean over the episode's samples of each sample's token-mean entropy)."""
    index = torch.as_tensor(list(trajectory), dtype=torch.long)
    sums = torch.zeros(trajectories, dtype=torch.float64).index_add_(0, index, turn_values.double())
    counts = torch.zeros(trajectories, dtype=torch.float64).index_add_(0, index, torch.ones(len(index)).double())
    return sums / counts.clamp(min=1.0)


def sampled_turn_entropy(turns: TurnRows) -> torch.Tensor:
    """(turn rows,) float64: each turn row's mean negative stored log-prob over its sampled tokens (0 for a row
    without one, as RAGEN-2's ``sum(H * mask) / max(sum(mask), 1)``)."""
    if turns.behavior_logprobs is None:
        raise ValueError("the sampled entropy needs behaviour log-probs, and scripted rows have none")
    out = np.zeros(len(turns.loss_mask))
    for row, (mask, logprobs) in enumerate(zip(turns.loss_mask, turns.behavior_logprobs, strict=True)):
        sampled = np.asarray(mask, dtype=bool)  # the stored log-probs are 0 off the loss mask
        out[row] = -float(np.asarray(logprobs, dtype=np.float64)[sampled].sum()) / max(int(sampled.sum()), 1)
    return torch.from_numpy(out)


def turn_entropy(trajectories: pa.Table, score: Callable[[TurnRows], torch.Tensor] | None = None) -> torch.Tensor:
    """(B,) float64: the filter's entropy of each trajectory row with per-turn training rows, as RAGEN-2's entropy
    filter computes an episode's in its turn-level modes: the mean over the episode's turn rows of each row's mean
    token entropy, ``score(turns)`` (the full distribution's, one value per turn row) or, without ``score``, the
    stored log-probs' estimate (:func:`sampled_turn_entropy`)."""
    turns = turn_rows_of_table(trajectories)
    values = score(turns) if score is not None else sampled_turn_entropy(turns)
    return mean_over_turns(values, turns.trajectory, trajectories.num_rows)
