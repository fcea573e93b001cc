"""Counter-based randomness: every random choice derives from (run seed, iteration, stage, ...).

``numpy.random.SeedSequence`` mixes the parts into independent streams; stage names are turned into integers with
CRC32 (stable across processes, unlike Python's salted ``hash()``).
"""

from __future__ import annotations

import zlib

import numpy as np


def _as_int(part: int | str) -> int:
    if isinstance(part, str):
        return zlib.crc32(part.encode())
    if part < 0:
        raise ValueError(f"seed parts must be non-negative, got {part}")
    return int(part)


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 31-bit seed derived from ``seed`` and the counter ``parts`` (e.g. iteration, stage name, turn)."""
    sequence = np.random.SeedSequence(entropy=_as_int(abs(seed)), spawn_key=tuple(_as_int(p) for p in parts))
    return int(sequence.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def derive_seeds(seed: int, count: int, *parts: int | str) -> list[int]:
    """``count`` distinct-stream 31-bit seeds derived from ``seed`` and ``parts`` (e.g. env instance seeds)."""
    sequence = np.random.SeedSequence(entropy=_as_int(abs(seed)), spawn_key=tuple(_as_int(p) for p in parts))
    return [int(x & 0x7FFFFFFF) for x in sequence.generate_state(count, dtype=np.uint32)]


def derive_rng(seed: int, *parts: int | str) -> np.random.Generator:
    """A numpy Generator for the stream (seed, *parts)."""
    return np.random.default_rng(derive_seed(seed, *parts))
