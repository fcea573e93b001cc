"""Key/value-cache reuse for the Hugging Face backend: no token of a rollout is encoded twice.

Two kinds of repeated work are removed, without changing what is computed (attention over the same tokens at the same
positions; only floating-point rounding may differ):

- **Shared first prompts.** Members of a group start from the same prompt; each distinct prompt is encoded once and
  its cache rows are copied to every member.
- **Multi-turn history.** Turn k+1's prompt is turn k's prompt, the sampled reply and the new environment text. The
  batch layout of turn k (left padding, the reply, the padding after each reply's stop token) is kept with its cache,
  and turn k+1 appends only the environment text, right-aligned; the columns between a reply's stop and the new text
  are masked out, and positions count unmasked tokens only (as ``generate`` derives them from the attention mask), so
  each row sees exactly its own token sequence.

A row continues from the previous call only if its prompt is the very list object of that call's row (the engine
passes each trajectory's growing ``input_ids``) and starts with that row's prompt and reply; anything else is encoded
afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ChunkState:
    """One generate call's batch, kept for the next turn: per row the trajectory's prompt list (identity), the real
    ids it had after the reply, and the padded layout with its attention mask and cache (all columns but the last)."""

    prompts: list[list[int]]
    ids: list[list[int]]
    sequences: torch.Tensor  # (b, W) long
    mask: torch.Tensor  # (b, W) long
    cache: Any


@dataclass
class Chunk:
    """Contexts generated together: their indices in the call, and the previous state they continue (or None)."""

    indices: list[int]
    previous: ChunkState | None = None
    rows: list[int] = field(default_factory=list)  # row of each index in ``previous``


def plan_chunks(prompts: list[list[int]], states: list[ChunkState], batch_size: int) -> list[Chunk]:
    """Group this call's prompts: rows continuing a previous chunk stay together (in order), the rest are chunked
    afresh by ``batch_size``."""
    owner = {id(prompt): (s, r) for s, state in enumerate(states) for r, prompt in enumerate(state.prompts)}
    continued: dict[int, Chunk] = {}
    fresh: list[int] = []
    for index, prompt in enumerate(prompts):
        hit = owner.get(id(prompt))
        if hit is not None:
            state, row = states[hit[0]], hit[1]
            known = state.ids[row]
            if state.prompts[row] is prompt and len(prompt) > len(known) and prompt[: len(known)] == known:
                chunk = continued.setdefault(hit[0], Chunk([], state, []))
                chunk.indices.append(index)
                chunk.rows.append(row)
                continue
        fresh.append(index)
    chunks = [continued[s] for s in sorted(continued)]
    chunks += [Chunk(fresh[start : start + batch_size]) for start in range(0, len(fresh), batch_size)]
    return chunks


def left_padded(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of ``prompts``, left-padded to the longest."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids from an attention mask, as ``generate`` derives them: unmasked tokens counted from 0."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def shared_prefix_cache(
    model: torch.nn.Module, prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Left-padded (ids, mask) of ``prompts`` and, when some prompts repeat, a cache of all columns but the last
    computed once per distinct prompt and copied to its rows (None when every prompt is distinct)."""
    ids, mask = left_padded(prompts, pad_id, device)
    distinct: dict[tuple[int, ...], int] = {}
    which = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    if len(distinct) == len(prompts) or ids.shape[1] < 2:
        return ids, mask, None
    first = torch.tensor([which.index(u) for u in range(len(distinct))], device=device)
    unique_ids, unique_mask = ids[first, :-1], mask[first, :-1]
    out = model(
        input_ids=unique_ids,
        attention_mask=unique_mask,
        position_ids=positions(unique_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.past_key_values
    cache.batch_select_indices(torch.tensor(which, device=device))
    return ids, mask, cache


def continued_inputs(chunk: Chunk, prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(ids, mask, cache) continuing ``chunk.previous``: its layout plus each row's new tokens, right-aligned."""
    previous = chunk.previous
    if previous is None:
        raise ValueError("continued_inputs needs a chunk that continues a previous state")
    device = previous.sequences.device
    rows = torch.tensor(chunk.rows, device=device)
    suffixes = [prompts[i][len(previous.ids[r]) :] for i, r in zip(chunk.indices, chunk.rows, strict=True)]
    tail_ids, tail_mask = left_padded(suffixes, pad_id, device)
    ids = torch.cat([previous.sequences[rows], tail_ids], dim=1)
    mask = torch.cat([previous.mask[rows], tail_mask], dim=1)
    cache = previous.cache
    cache.batch_select_indices(rows)
    return ids, mask, cache
