"""Where one steady-state update spends its time: a ``torch.profiler`` trace of one call of the update stage (the
in-process updater's ``update``: reading the kept batch from the lake, re-scoring it, the advantages, the actor's
optimizer steps), cut into kinds of work.

The device check runs it on a lent GPU (``python -m benchmarks.gpu_update_bench --profile DIR``), so its few minutes
say what keeps the update's MFU low (idle gaps between kernels, the optimizer, attention, copies) instead of only
that it is low. On CUDA the work items are the kernels: their time by kind, the share of the update's wall time the
GPU was busy (the union of the kernels' intervals over the wall time) and the costliest kernels. On a CPU the work
items are the operators' own (self) times, by the same kinds; there is no "busy" share, and the wall time not spent
in any operator is the host's own work (reading the batch, Python).

Kinds, matched on the kernel or operator name in this order (the first that matches): ``attention`` (flash, fused
or memory-efficient attention, ``scaled_dot_product``), ``matmul`` (GEMMs: cuBLAS/CUTLASS kernels, ``mm``,
``addmm``, ``bmm``), ``optimizer`` (the fused or multi-tensor optimizer kernels, ``_foreach_`` operators, Adam),
``collective`` (NCCL, gloo, all-reduce), ``copy`` (copies, casts and concatenations: ``copy_``, ``to``, memcpy)
and ``other`` (elementwise, reductions, softmax, the loss). The optimizer's whole step is also reported as the
inclusive time of torch's ``Optimizer.step`` range, which covers the non-fused optimizer's elementwise kernels too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|scaled_dot_product|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cublas|cutlass|\baten::(mm|addmm|bmm|_addmm_activation)\b|mkl|matmul", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply|_foreach_|optimizer", re.I)),
    ("collective", re.compile(r"nccl|gloo|all_?reduce|all_?gather|reduce_?scatter|broadcast", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|aten::to\b|_to_copy|cast|\baten::cat\b|CatArray", re.I)),
)
OPTIMIZER_RANGE = "Optimizer.step#"  # torch.optim's record_function around every optimizer's step


def kind_of(name: str) -> str:
    """The kind of work a kernel or operator ``name`` does (see the module docstring); ``other`` when none fits."""
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals (any unit in, the same unit out)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def summarize(
    items: list[tuple[str, float]],
    wall_s: float,
    device: str,
    busy_s: float | None = None,
    optimizer_s: float | None = None,
    top: int = 15,
) -> dict[str, Any]:
    """The profile's figures from its work ``items`` (name, seconds: kernels on a GPU, operators' self time on a
    CPU): seconds and share of the summed work per kind, the ``top`` names by time, the busy share (``busy_s`` over
    ``wall_s``, GPUs only) and the optimizer step's inclusive seconds."""
    total = sum(seconds for _, seconds in items)
    kinds: dict[str, float] = {kind: 0.0 for kind, _ in KINDS}
    kinds["other"] = 0.0
    by_name: dict[str, list[float]] = {}
    for name, seconds in items:
        kinds[kind_of(name)] += seconds
        entry = by_name.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    return {
        "device": device,
        "wall_s": wall_s,
        "work_s": total,
        "busy_s": busy_s,
        "busy_share": busy_s / wall_s if busy_s is not None and wall_s > 0 else None,
        "optimizer_step_s": optimizer_s,
        "kinds": {kind: {"s": s, "share": s / total if total else 0.0} for kind, s in kinds.items()},
        "top": [
            {"name": name, "kind": kind_of(name), "s": s, "calls": int(n), "share": s / total if total else 0.0}
            for name, (s, n) in ranked
        ],
    }


def from_profiler(profiler: Any, wall_s: float, device: str) -> dict[str, Any]:
    """:func:`summarize` of a finished ``torch.profiler.profile``: kernels on CUDA, operators' self CPU time else."""
    from torch.autograd import DeviceType

    events = profiler.events()
    optimizer = [e for e in events if e.name.startswith(OPTIMIZER_RANGE) and e.device_type == DeviceType.CPU]
    if device == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        items = [(e.name, (e.time_range.end - e.time_range.start) / 1e6) for e in kernels]
        busy = union_seconds([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e6
        optimizer_s = sum(e.device_time_total for e in optimizer) / 1e6 if optimizer else None
        return summarize(items, wall_s, device, busy_s=busy, optimizer_s=optimizer_s)
    items = [(e.name, e.self_cpu_time_total / 1e6) for e in events if e.device_type == DeviceType.CPU]
    optimizer_s = sum(e.cpu_time_total for e in optimizer) / 1e6 if optimizer else None
    return summarize(items, wall_s, device, optimizer_s=optimizer_s)


@contextmanager
def profiled_call(owner: type, attribute: str, call: int, result: dict[str, Any]) -> Iterator[None]:
    """Profile the ``call``-th (1-based) call of the method ``owner.attribute`` made inside the block (in this
    process) and put its :func:`from_profiler` summary into ``result`` (left empty when the block makes fewer
    calls). The device is CUDA when one is available (the benches' engines run there), else the CPU."""
    import torch

    from benchmarks.common import patched

    original = getattr(owner, attribute)
    seen = 0

    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen != call:
            return original(self, *args, **kwargs)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as profiler:
            started = time.perf_counter()
            value = original(self, *args, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - started
        result.update(from_profiler(profiler, wall, device))
        result.update(call=call, traced=f"{owner.__name__}.{attribute}")
        return value

    with patched(owner, attribute, traced):
        yield


def profiled_update(call: int, result: dict[str, Any]) -> AbstractContextManager[None]:
    """:func:`profiled_call` of the in-process update stage (``InProcessUpdater.update``), as the bench runs it."""
    from ragen_core.training.updater import InProcessUpdater

    return profiled_call(InProcessUpdater, "update", call, result)


def markdown(summary: dict[str, Any]) -> str:
    """The profile as a few lines and two tables (kinds, costliest names)."""
    if "wall_s" not in summary:
        return "No update was profiled (fewer policy updates than the profiled call).\n"
    on_gpu = summary["busy_share"] is not None
    unit = "kernel" if on_gpu else "operator (self)"
    head = f"Profiled `{summary.get('traced', 'update')}` (call {summary.get('call', '?')}, {summary['device']})"
    lines = [
        f"{head}: wall {summary['wall_s']:.3f} s, "
        f"{unit} time {summary['work_s']:.3f} s"
        + (
            f", GPU busy {summary['busy_share']:.1%} of the wall time"
            if on_gpu
            else f", in no operator (the host's own work) {max(summary['wall_s'] - summary['work_s'], 0):.3f} s"
        )
        + (f", optimizer step {summary['optimizer_step_s']:.3f} s" if summary["optimizer_step_s"] is not None else "")
        + ".",
        "",
        "| kind | s | share |",
        "|---|---|---|",
    ]
    for kind, entry in sorted(summary["kinds"].items(), key=lambda kv: kv[1]["s"], reverse=True):
        lines.append(f"| {kind} | {entry['s']:.4f} | {entry['share']:.1%} |")
    lines += ["", f"| {unit} | kind | calls | s | share |", "|---|---|---|---|---|"]
    for row in summary["top"]:
        name = row["name"] if len(row["name"]) <= 90 else row["name"][:87] + "..."
        lines.append(
            f"| `{name.replace('|', '/')}` | {row['kind']} | {row['calls']} | {row['s']:.4f} | {row['share']:.1%} |"
        )
    return "\n".join(lines) + "\n"
