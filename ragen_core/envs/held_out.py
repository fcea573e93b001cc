"""Validation held out by map: the maps a run validates on are maps its training can never draw.

An env whose instance is a map drawn from a small space (Sokoban rooms, FrozenLake lakes: a few thousand distinct
maps, the map a function of the seed alone) meets the same map under two different seeds, so validation held out
by seed alone is not held out: before this, 18-21% of Sokoban validation rooms were rooms the same run had met in
its bootstrap or training. Such an env sets ``held_out_maps = True`` (:class:`ragen_core.envs.base.TextEnv`), and
its maps are split by content: a map is a validation map when the SHA-256 of its key (:meth:`TextEnv.map_key`, the
state as first rendered) falls in one of :data:`BUCKETS` buckets, so one map in ``BUCKETS`` is reserved for
validation whatever seed draws it. A training seed (rollouts, the bootstrap's demonstrations) that draws a
validation map is replaced by the next seed of its own derived stream that does not; a validation seed by the next
one that does. The split is a pure function of (env, options, seed, split): every process, resume and re-run draws
the same maps, and the seed stored with each trajectory is the one that was played.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from ragen_core.config import RunConfig
from ragen_core.envs.remote import open_env
from ragen_core.seeding import derive_seed, derive_seeds

Split = Literal["train", "val"]
BUCKETS = 8  # one map in 8 is a validation map
MAX_DRAWS = 2_000  # seeds tried for one instance before the env is said to have too few maps to split


class HeldOutError(ValueError):
    """An env whose maps cannot be split (too few distinct maps, or none of one side within the draws)."""


def holds_out_maps(
    env_name: str, options: dict[str, Any] | None = None, remote: str | None = None, timeout_s: float | None = None
) -> bool:
    """Whether ``env_name`` (with ``options``; played on the server ``remote``, when given) draws maps split between
    training and validation (its ``held_out_maps``)."""
    return bool(getattr(open_env(env_name, options, remote, timeout_s), "held_out_maps", False))


def is_validation_map(key: str) -> bool:
    """Whether the map with this key is reserved for validation: its SHA-256, read as a number, in bucket 0."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % BUCKETS == 0


def split_seeds(
    env_name: str,
    options: dict[str, Any] | None,
    seeds: list[int],
    split: Split,
    remote: str | None = None,
    timeout_s: float | None = None,
) -> list[int]:
    """``seeds`` with each replaced, where needed, by the first seed of its stream whose map belongs to ``split``
    (unchanged for an env that does not hold out maps); ``remote``: the server that plays the env (``env.remote``),
    its calls within ``timeout_s``."""
    if not holds_out_maps(env_name, options, remote, timeout_s):
        return list(seeds)
    shown = json.dumps(options or {}, sort_keys=True, default=str)
    known = _SPLITS.setdefault((env_name, shown, split), {})  # the same maps whether played here or on a server
    missing = [int(seed) for seed in seeds if int(seed) not in known]
    if missing:  # one env for the seeds not split before (building an env per seed cost more than the splits)
        if len(known) > MAX_KNOWN:
            known.clear()
        env = open_env(env_name, json.loads(shown), remote, timeout_s)
        known.update({seed: _split_seed(env, env_name, seed, split) for seed in missing})
    return [known[int(seed)] for seed in seeds]


def validation_seeds(config: RunConfig, env_name: str) -> list[int]:
    """The env seeds of the run's fixed validation instances of ``env_name``: derived from ``eval.seed`` and, when
    the config holds out maps (``eval.held_out=maps``) and the env draws maps, each moved onto a validation map."""
    seeds = derive_seeds(config.eval.seed, config.eval.instances, "val", env_name)
    if config.eval.held_out != "maps":
        return seeds
    remote = (config.env.remote_for(env_name), config.env.user_code_timeout_s)
    return split_seeds(env_name, dict(config.env.options), seeds, "val", *remote)


_SPLITS: dict[tuple[str, str, str], dict[int, int]] = {}  # (env, options, split) -> {seed: the seed it moves to}
MAX_KNOWN = 1 << 16  # seeds remembered per (env, options, split)


def _split_seed(env: Any, env_name: str, seed: int, split: Split) -> int:
    """The first seed of ``seed``'s stream whose map (drawn by ``env``) belongs to ``split``."""
    want = split == "val"
    candidate = seed
    for draw in range(MAX_DRAWS):
        env.reset(candidate)
        if is_validation_map(env.map_key()) == want:
            return candidate
        candidate = derive_seed(seed, "held_out", split, draw)
    raise HeldOutError(
        f"env {env_name!r}: no {split} map within {MAX_DRAWS} seeds from seed {seed}: its options leave too few "
        "distinct maps to hold one in eight out for validation; set eval.held_out=seeds to validate on held-out "
        "seeds instead (maps may then repeat)"
    )


__all__ = [
    "BUCKETS",
    "HeldOutError",
    "Split",
    "holds_out_maps",
    "is_validation_map",
    "split_seeds",
    "validation_seeds",
]
