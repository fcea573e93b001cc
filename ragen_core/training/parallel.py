"""Data parallelism for the update: which micro-batches a rank runs, and sums over ranks.

A mini-batch is cut into micro-batches exactly as in one process (under a token budget, its rows sorted by length
and cut so that no micro-batch exceeds the budget; else consecutive rows of the shuffled schedule); rank r of W runs
micro-batches r, r + W, r + 2W, ... Every rank runs the same number of forward/backward passes, because
ZeRO-2/3 reduce gradients (and ZeRO-3 gathers weights) inside those passes: a rank with one micro-batch fewer runs a
padding pass whose loss is multiplied by 0. The loss normalisers (token counts, sequence shares) are those of the
whole mini-batch, and DeepSpeed averages gradients over ranks, so each rank scales its loss by W: the summed gradient
is then the one-process gradient, up to float summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MicroBatchPlan:
    """One forward/backward pass of a rank: the rows, and 1.0 for a real pass or 0.0 for a padding pass."""

    rows: list[int]
    weight: float


def data_parallel_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def micro_batches(
    rows: list[int], size: int, lengths: list[int] | None = None, max_tokens: int | None = None
) -> list[list[int]]:
    """One mini-batch's ``rows`` cut into micro-batches.

    Without ``max_tokens``: consecutive runs of ``size`` rows (the last may be smaller). With it (a token budget, as
    verl's ``ppo_max_token_len_per_gpu``): the rows sorted by ``lengths`` (longest first, ties in their order) and
    cut greedily, each micro-batch holding at most ``size`` rows and at most ``max_tokens`` padded tokens (its rows
    times its longest row; a row longer than the budget is a micro-batch alone). Rows of like length then share a
    micro-batch, so little of a pass is padding, and short rows fill large passes.
    """
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    if max_tokens is None:
        return [rows[start : start + size] for start in range(0, len(rows), size)]
    if max_tokens < 1:
        raise ValueError(f"micro-batch token budget must be >= 1, got {max_tokens}")
    if lengths is None or len(lengths) != len(rows):
        raise ValueError("a token budget needs one length per row")
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])  # stable: ties keep their order
    chunks: list[list[int]] = []
    longest = 0
    for i in order:
        if chunks and len(chunks[-1]) < size and (len(chunks[-1]) + 1) * longest <= max_tokens:
            chunks[-1].append(rows[i])  # sorted longest first: the chunk's longest row is its first
        else:
            chunks.append([rows[i]])
            longest = lengths[i]
    return chunks


def shard_micro_batches(
    rows: list[int],
    size: int,
    rank: int,
    world: int,
    lengths: list[int] | None = None,
    max_tokens: int | None = None,
) -> list[MicroBatchPlan]:
    """The passes of ``rank``: its share of the micro-batches of ``rows`` (:func:`micro_batches`: ``size`` rows
    each, or under a token budget ``max_tokens`` with the rows' ``lengths``), padded with zero-weight passes so that
    every rank runs ``ceil(micro-batches / world)`` passes.

    With ``world == 1`` this is every micro-batch in order, as in one process.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    chunks = micro_batches(rows, size, lengths, max_tokens)
    if not chunks:
        return []
    passes = -(-len(chunks) // world)
    mine = [MicroBatchPlan(chunk, 1.0) for chunk in chunks[rank::world]]
    smallest = min(chunks, key=len)
    return mine + [MicroBatchPlan(smallest, 0.0)] * (passes - len(mine))


def all_reduce_sum(tensor: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """Element-wise sum of ``tensor`` over all ranks (the tensor itself in a world of one)."""
    return _all_reduce(tensor, device, "SUM")


def all_reduce_max(tensor: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """Element-wise maximum of ``tensor`` over all ranks (the tensor itself in a world of one)."""
    return _all_reduce(tensor, device, "MAX")


def _all_reduce(tensor: torch.Tensor, device: torch.device | None, op: str) -> torch.Tensor:
    import torch.distributed as dist

    _, world = data_parallel_world()
    if world == 1:
        return tensor
    work = tensor.to(device) if device is not None else tensor.clone()
    dist.all_reduce(work, op=getattr(dist.ReduceOp, op))
    return work.to(tensor.device)


def all_reduce_sums(values: dict[str, float], device: torch.device | None = None) -> dict[str, float]:
    """Sum each named value over all ranks (every rank must hold the same keys)."""
    _, world = data_parallel_world()
    if world == 1:
        return values
    keys = sorted(values)
    summed = all_reduce_sum(torch.tensor([values[k] for k in keys], dtype=torch.float64), device)
    return {key: float(value) for key, value in zip(keys, summed.tolist(), strict=True)}


def communication_device(module: torch.nn.Module) -> torch.device:
    """Where collective tensors must live: the module's device (NCCL needs CUDA tensors, gloo takes CPU ones)."""
    for parameter in module.parameters():
        return parameter.device
    return torch.device("cpu")
