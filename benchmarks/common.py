"""Shared measurement helpers: interleaved repeats, spread, profiles, resident memory and the machine's description.

Absolute times on a shared machine are noise, so every figure is a ratio whose numerator and denominator are timed
in the same process, interleaved (A B, then B A, ...), so both sides see the same load.
"""

from __future__ import annotations

import cProfile
import io
import os
import platform
import pstats
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and relative spread ((max - min) / median) of repeated measurements."""
    if not values:
        raise ValueError("spread() needs at least one value")
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "rel_spread": (max(values) - min(values)) / median if median else float("nan"),
    }


def interleave(sides: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[tuple[float, Any]]]:
    """Run each side ``repeats`` times, alternating the order every repeat (A B, B A, A B, ...).

    Returns, per side, ``(seconds, result)`` of every repeat. Each call is timed on its own with ``perf_counter``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    names = list(sides)
    out: dict[str, list[tuple[float, Any]]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            result = sides[name]()
            out[name].append((time.perf_counter() - started, result))
    return out


def ratio_of_rates(ours: list[float], theirs: list[float]) -> dict[str, float]:
    """Per-repeat ratios ours[i] / theirs[i] of two interleaved rate series, with their spread."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} numerators but {len(theirs)} denominators")
    return spread([a / b for a, b in zip(ours, theirs, strict=True)])


def profile_top(fn: Callable[[], Any], limit: int = 12, sort: str = "tottime") -> list[str]:
    """Run ``fn`` once under cProfile; its ``limit`` top entries (by ``sort``) as 'seconds  function' lines."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    stats.sort_stats(sort)
    lines = []
    for func in stats.fcn_list[:limit]:  # type: ignore[attr-defined]
        _, _, tottime, cumtime, _ = stats.stats[func]  # type: ignore[attr-defined]
        filename, line, name = func
        where = f"{_short(filename)}:{line}({name})" if line else name
        lines.append(f"{tottime:7.3f}s self {cumtime:7.3f}s cum  {where}")
    return lines


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/work/main/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc; falls back to the peak where /proc is absent)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class RssSampler:
    """Samples this process's resident memory every ``interval`` seconds in a daemon thread; ``window()`` returns
    the peak seen since the last call (the per-iteration peak when called once per iteration)."""

    interval: float = 0.01
    _peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self._peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, rss_bytes())

    def window(self) -> int:
        peak = max(self._peak, rss_bytes())
        self._peak = rss_bytes()
        return peak

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class StopWatch:
    """Accumulates the seconds spent inside wrapped callables (a measurement harness; results pass through)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
                self.calls[name] = self.calls.get(name, 0) + 1

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def take(self) -> dict[str, float]:
        """The accumulated seconds per name since the last ``take``, then reset."""
        seconds, self.seconds, self.calls = self.seconds, {}, {}
        return seconds


@contextmanager
def patched(target: Any, name: str, replacement: Any) -> Iterator[None]:
    """Set ``target.name = replacement`` for the duration of the block."""
    original = getattr(target, name)
    setattr(target, name, replacement)
    try:
        yield
    finally:
        setattr(target, name, original)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(device: str = "cpu") -> dict[str, Any]:
    """The machine the benchmark ran on: CPU, cores, memory, load, library versions and (on cuda) the GPU."""
    import torch

    versions = {}
    for package in ("torch", "transformers", "deepspeed", "prefect", "pyarrow", "duckdb", "trl"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (OSError, ValueError):
        memory_gib = float("nan")
    info = {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(memory_gib, 1),
        "load_average_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None,
        "versions": versions,
    }
    return info


def quiet_libraries(device: str = "cpu") -> None:
    """No progress bars, telemetry or chatty logs from the libraries under test (set before they are imported)."""
    import logging

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name in ("great_expectations", "DeepSpeed", "deepspeed", "transformers", "trl", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def replace_marked_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace (or append) the text between the ``begin`` and ``end`` markers of a report such as RESULTS.md."""
    text = path.read_text() if path.is_file() else "# Benchmark results\n"
    block = f"{begin}\n{section}{end}"
    if begin in text and end in text:
        text = text.split(begin, 1)[0] + block + text.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def shape_bench_main(doc: str, measure: Callable[[str, int, int], dict[str, Any]], threads_help: str) -> None:
    """The command line of a side-by-side benchmark over one model shape (``--shape``, ``--repeats``, ``--threads``):
    ``measure(shape, repeats, threads)``'s result printed as JSON."""
    import argparse
    import json

    import torch

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--shape", default="20m", help="Model shape from benchmarks/models.py (tiny, 20m, 0.5b).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help=threads_help)
    args = parser.parse_args()
    quiet_libraries("cpu")
    torch.set_num_threads(args.threads)
    print(json.dumps(measure(args.shape, args.repeats, args.threads), indent=1, default=str))
