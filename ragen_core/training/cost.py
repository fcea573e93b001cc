"""What an update costs: its wall time, its model FLOPs and the share of the device's peak they reach (MFU), its
tokens per second and its peak memory, recorded as ``perf/*`` metrics of every iteration that updates.

**Model FLOPs** count the matrix multiplications of the passes the update runs, over the tokens the rows hold
(padding is waste, not work), as MFU counts them (PaLM, appendix B): per token, 2 x the weights of every linear
layer but the output head; per sequence and layer, 4 x n^2 x (heads x head size) for the attention scores and their
weighting (n: the sequence's length; a packed row's sequences each their own); and 2 x the head's weights only at
the positions the head projects (the trained columns when the model takes ``logits_to_keep``: a fifth of a
windowed batch). A backward pass costs twice its forward. Norms, activations, the softmax and the optimizer are
left out. The actor tallies its passes as it runs them; the critic's (the ``gae`` estimators) are counted from the
batch, which each of its passes covers whole: one forward for the values, then a forward and backward per epoch
(:func:`critic_passes`; the count does not depend on how the rows are cut into micro-batches). Summed over a
launched group's ranks.

**The peak** is the data sheet's dense bf16/fp16 figure for known GPUs; otherwise (a CPU, an unknown GPU, fp32) it is
measured once per process: the best FLOP/s of a square ``torch.mm`` in the update's precision with the threads the
update uses (a shared CPU reaches no data-sheet figure).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ragen_core.training.parallel import all_reduce_max, all_reduce_sums, data_parallel_world
from ragen_core.update.rows import TokenBatch

# Dense bf16/fp16 peaks (TFLOP/s, no sparsity) from the vendors' data sheets, by a word of the device's name.
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}


@dataclass(frozen=True)
class ModelShape:
    """What a model's FLOPs per token depend on (see the module docstring)."""

    linear_weights: int  # weights of every linear layer but the output head
    head_weights: int  # weights of the output head (0 when there is none: its linear layers count per token)
    layers: int
    attention_width: int  # heads x head size

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        """The shape of a Hugging Face causal LM (or a value model on its backbone)."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
        config = next((m.config for m in model.modules() if hasattr(getattr(m, "config", None), "hidden_size")), None)
        if config is None:
            return cls(linear, head.weight.numel() if head is not None else 0, 0, 0)
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(linear, head.weight.numel() if head is not None else 0, config.num_hidden_layers, heads * head_dim)

    def forward_flops(self, batch: TokenBatch, columns: torch.Tensor | None = None) -> float:
        """Model FLOPs of one forward pass over ``batch`` (host tensors), the head at ``columns`` only when given."""
        mask = batch.attention_mask
        tokens = float(mask.sum())
        positions = float(mask[:, columns.cpu()].sum()) if columns is not None else tokens
        return (
            2.0 * self.linear_weights * tokens
            + 4.0 * self.layers * self.attention_width * sequence_squares(batch)
            + 2.0 * self.head_weights * positions
        )


def sequence_squares(batch: TokenBatch) -> float:
    """The sum of n^2 over the batch's sequences: each row, or each sequence packed in a row (positions restart at
    0 where one begins)."""
    mask = batch.attention_mask > 0
    if batch.position_ids is None:
        lengths = mask.sum(dim=1).double()
        return float((lengths * lengths).sum())
    starts = (batch.position_ids == 0) & mask
    segment = torch.cumsum(starts.long(), dim=1).clamp(min=1) - 1
    width = mask.shape[1]
    keys = (torch.arange(mask.shape[0])[:, None] * width + segment)[mask]
    lengths = torch.bincount(keys).double()
    return float((lengths * lengths).sum())


@dataclass
class PassTally:
    """The FLOPs and tokens of the passes an engine ran since :meth:`reset` (kept by the actor and the critic)."""

    shape: ModelShape
    flops: float = 0.0
    tokens: float = 0.0

    def add(self, batch: TokenBatch, columns: torch.Tensor | None = None, backward: bool = False) -> None:
        """One forward pass over ``batch`` (host tensors), and its backward when ``backward``."""
        self.flops += self.shape.forward_flops(batch, columns) * (3.0 if backward else 1.0)
        self.tokens += float(batch.attention_mask.sum())

    def reset(self) -> None:
        self.flops = self.tokens = 0.0


def critic_passes(model: torch.nn.Module, batch: TokenBatch, epochs: int) -> PassTally:
    """The FLOPs and tokens of a critic's part of an update over ``batch`` (host tensors): the values (one forward),
    then ``epochs`` passes of forward and backward."""
    tally = PassTally(ModelShape.of(model))
    tally.flops = tally.shape.forward_flops(batch) * (1 + 3 * epochs)
    tally.tokens = float(batch.attention_mask.sum()) * (1 + epochs)
    return tally


def matmul_peak_tflops(
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    size: int | None = None,
    repeats: int = 5,
    seconds: float = 0.5,
) -> float:
    """The best TFLOP/s of ``torch.mm`` on ``size`` x ``size`` matrices over ``repeats`` timed bursts of about
    ``seconds`` each (the best burst: on a loaded machine the others are the neighbours' noise). Its random
    matrices come from a generator of its own: the process's random state is not touched."""
    size = size or (8192 if device == "cuda" else 1024)
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn((size, size), generator=generator).to(device=device, dtype=dtype)
    b = torch.randn((size, size), generator=generator).to(device=device, dtype=dtype)
    out = torch.empty((size, size), device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up (kernel choice, pages)
    best, flops = 0.0, 2.0 * size**3
    for _ in range(repeats):
        calls, started = 0, time.perf_counter()
        while True:
            torch.mm(a, b, out=out)
            calls += 1
            if device == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        best = max(best, flops * calls / elapsed / 1e12)
    return best


@functools.lru_cache(maxsize=8)
def device_peak_tflops(device_type: str, dtype: torch.dtype, threads: int) -> float:
    """The peak an update on ``device_type`` in ``dtype`` is measured against: the data sheet's for a known GPU in
    bf16/fp16, else a short :func:`matmul_peak_tflops` (0.3 s, once per process and setting)."""
    if device_type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        name = torch.cuda.get_device_name()
        known = next((peak for word, peak in PEAK_TFLOPS.items() if word in name), None)
        if known is not None:
            return known
    size = 4096 if device_type == "cuda" else 512
    return matmul_peak_tflops(device_type, dtype, size=size, repeats=3, seconds=0.1)


def _maxima(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each named value's maximum over all ranks (the values themselves in a world of one)."""
    keys = sorted(values)
    maxima = all_reduce_max(torch.tensor([values[k] for k in keys], dtype=torch.float64), device)
    return {key: float(value) for key, value in zip(keys, maxima.tolist(), strict=True)}


_PEAK_RSS = re.compile(r"^VmHWM:\s+(\d+) kB", re.M)


def _reset_peak_rss() -> None:
    """Start the process's peak resident set size over (Linux: ``clear_refs`` 5); elsewhere it stays the process's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_gb() -> float | None:
    try:
        found = _PEAK_RSS.search(Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(found.group(1)) / 2**20 if found else None


class UpdateClock:
    """Times one update and reads its costs: enter before the update's first pass, :meth:`metrics` after its last."""

    def __init__(self, engines: list[Any], device: torch.device, dtype: torch.dtype) -> None:
        self.tallies = [engine.tally for engine in engines if getattr(engine, "tally", None) is not None]
        self.device, self.dtype = device, dtype
        self.started = 0.0

    def __enter__(self) -> UpdateClock:
        for tally in self.tallies:
            tally.reset()
        _reset_peak_rss()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add(self, tally: PassTally) -> None:
        """Passes counted outside the engines' own tallies (the critic's: :func:`critic_passes`)."""
        self.tallies.append(tally)

    def metrics(self) -> dict[str, float]:
        """``perf/*`` of the update, summed (FLOPs, tokens) or maxed (time, memory) over a launched group's ranks."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - self.started
        rss = _peak_rss_gb()
        local = {"flops": sum(t.flops for t in self.tallies), "tokens": sum(t.tokens for t in self.tallies)}
        summed = all_reduce_sums(local, self.device)
        _, world = data_parallel_world()
        peaks = _maxima({"seconds": seconds, "rss": rss or 0.0, "cuda": self._cuda_gb()}, self.device)
        tflops = summed["flops"] / peaks["seconds"] / 1e12 if peaks["seconds"] > 0 else 0.0
        peak = device_peak_tflops(self.device.type, self.dtype, torch.get_num_threads()) * world
        metrics = {
            "perf/update_s": peaks["seconds"],
            "perf/model_tflop": summed["flops"] / 1e12,
            "perf/tflops": tflops,
            "perf/mfu": tflops / peak if peak > 0 else 0.0,
            "perf/tokens_per_s": summed["tokens"] / peaks["seconds"] if peaks["seconds"] > 0 else 0.0,
        }
        if rss is not None:
            metrics["perf/peak_rss_gb"] = peaks["rss"]
        if self.device.type == "cuda":
            metrics["perf/peak_cuda_gb"] = peaks["cuda"]
        return metrics

    def _cuda_gb(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else 0.0


__all__ = [
    "PEAK_TFLOPS",
    "ModelShape",
    "PassTally",
    "UpdateClock",
    "critic_passes",
    "device_peak_tflops",
    "matmul_peak_tflops",
    "sequence_squares",
]
