"""Per-turn training rows (``rollout.training_rows: turn``): RAGEN-2's samples in its context-window modes.

In the windowed context modes a trajectory's stored row packs one sequence per turn (that turn's window prompt, mask
0, then its reply, mask 1) back to back, with ``segment_lengths``. RAGEN-2 (``ragen/llm_agent/ctx_manager.py``,
``_build_single_turn_samples`` / ``_build_limited_multi_turn_samples``) trains each turn as its own sample carrying
the episode's reward on its last token, so the update's rows are turns: the loss aggregation and the mini-batches
count turn rows. :func:`ragen_core.update.rows.turn_rows_of_table` cuts the stored rows into those turn rows (for the
update's inputs and for this module). Nothing is re-tokenised or rebuilt: each turn row is exactly the token ids the
policy was prompted with and sampled at that turn, with the sampler's stored log-probs of them, so the lake's rows
stay the only source of truth (a resume replays the same rows). This module holds the entropy filter's view of them:
an episode's entropy as the mean over its turn rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch

from ragen_core.update.rows import TurnRows, turn_rows_of_table


def mean_over_turns(turn_values: torch.Tensor, trajectory: np.ndarray, trajectories: int) -> torch.Tensor:
    """(``trajectories``,) float64: the mean of each trajectory's turn-row values (RAGEN-2's episode entropy in its
    turn-level modes: the mean over the episode's samples of each sample's token-mean entropy)."""
    index = torch.as_tensor(trajectory, dtype=torch.long)
    sums = torch.zeros(trajectories, dtype=torch.float64).index_add_(0, index, turn_values.double())
    counts = torch.zeros(trajectories, dtype=torch.float64).index_add_(0, index, torch.ones(len(index)).double())
    return sums / counts.clamp(min=1.0)


def sampled_turn_entropy(turns: TurnRows) -> torch.Tensor:
    """(turn rows,) float64: each turn row's mean negative stored log-prob over its sampled tokens (0 for a row
    without one, as RAGEN-2's ``sum(H * mask) / max(sum(mask), 1)``)."""
    tokens = turns.tokens
    if tokens.logprobs is None:
        raise ValueError("the sampled entropy needs behaviour log-probs, and scripted rows have none")
    logprobs, sampled = tokens.logprobs.astype(np.float64), tokens.mask.astype(bool)  # log-probs are 0 off the mask
    out = np.zeros(len(tokens))
    for row, (start, stop) in enumerate(zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)):
        chosen = sampled[start:stop]  # one numpy sum per row: the summation order of a row's own sum
        out[row] = -float(logprobs[start:stop][chosen].sum()) / max(int(chosen.sum()), 1)
    return torch.from_numpy(out)


def turn_entropy(trajectories: pa.Table, score: Callable[[TurnRows], torch.Tensor] | None = None) -> torch.Tensor:
    """(B,) float64: the filter's entropy of each trajectory row with per-turn training rows, as RAGEN-2's entropy
    filter computes an episode's in its turn-level modes: the mean over the episode's turn rows of each row's mean
    token entropy, ``score(turns)`` (the full distribution's, one value per turn row) or, without ``score``, the
    stored log-probs' estimate (:func:`sampled_turn_entropy`)."""
    turns = turn_rows_of_table(trajectories)
    values = score(turns) if score is not None else sampled_turn_entropy(turns)
    return mean_over_turns(values, turns.trajectory, trajectories.num_rows)
