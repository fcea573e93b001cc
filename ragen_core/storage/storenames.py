"""What the names of a data root in an object store mean (:mod:`ragen_core.storage.storecopy`): which lake paths
live in the bucket, which run and iteration a path belongs to, where the local copy of a bucket lies; and the checks
of what is read from a bucket (an object's name before it names a file of the copy, a changeset's shape) and of the
store itself (that it honours conditional writes)."""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ragen_core.storage import layout
from ragen_core.storage.files import TRASH_PREFIX, LakeError
from ragen_core.storage.objectstore import Store, StoreRoot

CACHE_ENV = "RAGEN_OBJECT_CACHE"
STATE_FILE = layout.STORE_STATE  # in the copy: the bucket's URL and what the copy holds of it
STATE_LOCK = ".object_store.lock"
UPLOADS = "_uploads"  # in the bucket: _uploads/<run>/<token>/<lake path> and _uploads/<run>/<token>.json
_DIGITS = re.compile(r"[0-9]+")
REWRITE_COMMITTED = ".committed"  # _uploads/<run>/<token>.committed: a rewrite's changeset is committed
STORE_KEY = "_object_store"  # in a commit object: {"changeset": token}; never in the copy's commit marker
TRANSFERS = 8  # requests a copy sends to the store at once (uploads, downloads, copies, deletes)
_NOT_SYNCED_TOP = {layout.STAGING, layout.LOCKS, layout.PREFECT, STATE_FILE, STATE_LOCK, UPLOADS}
_NOT_SYNCED_IN_RUN = {layout.WRITER_LOCK, layout.WRITER_LEASE, layout.SPACE_RESERVE, layout.UPDATE_GROUP}
_NOT_SYNCED_IN_RUN |= {layout.VLLM_SERVER, layout.SAMPLER, layout.STORE_LEASE}
_SCRATCH = re.compile(r"\..+\.(tmp|download)-[0-9a-z-]+")
COMMIT_OBJECT = re.compile(rf"{layout.COMMITS}/([^/]+)/{re.escape(layout.KEYED_ITERATION)}(\d+)\.json")
_RECORD = re.compile(
    rf"{layout.COMMITS}/[^/]+/{layout.PARTS_RECORDS}/[^/]+/{re.escape(layout.KEYED_ITERATION)}(\d+)\.json"
)
_HIDDEN = (TRASH_PREFIX, layout.UPGRADING_PREFIX)  # a folder on its way out, or a partition an upgrade fills
_UNSAFE = re.compile(r"[\\\x00-\x1f\x7f]")


def cache_folder(root: StoreRoot) -> Path:
    """The local copy of ``root``: ``<base>/<bucket>/<prefix, its '/' written '~'>`` (the bucket's top:
    ``<bucket>/_top``; no prefix's copy lies inside another's), the base ``$RAGEN_OBJECT_CACHE``, else ``objects/`` in
    the user's cache folder (``$RAGEN_CACHE_DIR``, else ``$XDG_CACHE_HOME/ragen``, else ``~/.cache/ragen``)."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragen"
        base = str(Path(os.environ.get("RAGEN_CACHE_DIR") or home) / "objects")
    return Path(base).expanduser().resolve() / root.bucket / (root.prefix.replace("/", "~") or "_top")


def checked_relative(relative: str, url: str) -> str:
    """``relative`` (an object's path under the data root) when it can name a file of the local copy; a
    :class:`LakeError` otherwise (an empty, ``.`` or ``..`` folder, a backslash or control character: an object
    planted to write outside the copy)."""
    parts = relative.split("/")
    if not relative or _UNSAFE.search(relative) or any(p in ("", ".", "..") for p in parts):
        raise LakeError(
            f"the object {relative!r} under {url} cannot name a file of the data root (an empty, '.' or '..' folder, "
            "or a control character); the lake never writes one: remove it from the bucket, then try again"
        )
    return relative


def folder_marker(relative: str, size: int) -> bool:
    """Whether an object is a folder marker (an empty object named ``.../``, as consoles make): never a file."""
    return relative.endswith("/") and size == 0


def as_json(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object, or {} when it is not one (damaged, planted: never an error of its own)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def stage_record(relative: str) -> int | None:
    """The iteration of a finished stage's record (``_staging/<run>/<iteration>/<stage>/_DONE.json``), or None. The
    one file of staging the bucket holds: an async run's batch sampled ahead is published before its iteration is
    committed, and its record travels with the commit that waited for it, so another host resuming keeps it."""
    parts = relative.split("/")
    if (
        len(parts) == 5
        and parts[0] == layout.STAGING
        and _DIGITS.fullmatch(parts[2])
        and parts[4] == layout.DONE_MARKER
    ):
        return None if any(p.startswith(TRASH_PREFIX) for p in parts) else int(parts[2])
    return None


def staging_walked(relative: str) -> bool:
    """Whether a folder of staging can hold stage records (``_staging/<run>/<iteration>/<stage>``, or above)."""
    parts = relative.split("/")
    return parts[0] == layout.STAGING and len(parts) <= 4 and (len(parts) < 3 or bool(_DIGITS.fullmatch(parts[2])))


def synced(relative: str) -> bool:
    """Whether the lake path ``relative`` lives in the bucket (else it is the copy's own: staging but the stage
    records, locks, ...)."""
    parts = relative.split("/")
    if stage_record(relative) is not None:
        return True
    if parts[0] in _NOT_SYNCED_TOP or _SCRATCH.fullmatch(parts[-1]) or any(p.startswith(_HIDDEN) for p in parts):
        return False
    return not (parts[0] == layout.RUNS and len(parts) > 2 and parts[2] in _NOT_SYNCED_IN_RUN)


def run_of(relative: str) -> str | None:
    """The run a lake path belongs to (its rows, commits, manifest, checkpoints, quarantine, stage records), or None
    (models, sweeps, the layout file)."""
    parts = relative.split("/")
    if len(parts) < 3:
        return None
    if parts[0] in (layout.COMMITS, layout.RUNS, layout.STAGING):
        return parts[1]
    if parts[0] == layout.QUARANTINE and parts[1].startswith(layout.QUARANTINE_RUN_PREFIX):
        return parts[1][len(layout.QUARANTINE_RUN_PREFIX) :]
    if parts[1].startswith(layout.RUN_FOLDER_PREFIX) and not parts[0].startswith("_"):
        return parts[1][len(layout.RUN_FOLDER_PREFIX) :]
    return None


def old_layout_run(relative: str) -> str | None:
    """The run whose rows a file of lake layout 1 holds (``<table>/run_id=<id>/iteration=<n>/<file>``: a bucket
    filled from a data root of an older version, which ``ragen upgrade-lake`` moves), or None for any other path
    (the quarantine's ``run_id=`` folders included)."""
    parts = relative.split("/")
    if len(parts) != 4 or parts[0].startswith("_") or parts[0] == layout.QUARANTINE:
        return None
    if not parts[1].startswith(layout.OLD_RUN_FOLDER_PREFIX) or not layout.ITERATION_FOLDER.fullmatch(parts[2]):
        return None
    return parts[1][len(layout.OLD_RUN_FOLDER_PREFIX) :]


def rows_iteration(relative: str) -> int | None:
    """The iteration whose rows a lake path holds (a part file of a partition, or that partition's record of its
    parts), or None."""
    parts = relative.split("/")
    if len(parts) == 4 and run_of(relative) and parts[1].startswith(layout.RUN_FOLDER_PREFIX):
        match = layout.PARTITION_ITERATION.fullmatch(parts[2])
        return int(match.group(1)) if match else None
    match = _RECORD.fullmatch(relative)
    return int(match.group(1)) if match else None


def table_of(relative: str) -> str | None:
    """The table whose rows a lake path holds (a file of ``<table>/run-<id>/``, or a partition's record of its
    parts), or None."""
    parts = relative.split("/")
    if _RECORD.fullmatch(relative):
        return parts[3]
    if len(parts) > 2 and not parts[0].startswith("_") and parts[1].startswith(layout.RUN_FOLDER_PREFIX):
        return parts[0]
    return None


def for_tables(relative: str, models: bool = False, tables: frozenset[str] | None = None) -> bool:
    """Whether a lake path is one the tables and the ``runs`` listing read (not a run's checkpoint or log; a model
    only with ``models``; with ``tables``, the row files of those tables alone, every run's manifest and commits
    still)."""
    parts = relative.split("/")
    if tables is not None and table_of(relative) not in (None, *tables):
        return False
    if parts[0] == layout.MODELS:
        return models
    if parts[0] == layout.STAGING:  # a writer's stage records: with its run (StoreCopy.take_run)
        return False
    return not (parts[0] == layout.RUNS and len(parts) > 2 and parts[2] != layout.MANIFEST)


def each(work: Any, items: list[Any]) -> list[Any]:
    """``work(item)`` for every item, :data:`TRANSFERS` at a time (each is a request to the store, which waits on
    the network); their results in order; the first failure raised."""
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(TRANSFERS, len(items))) as pool:
        return list(pool.map(work, items))


_probed: set[str] = set()


def check_conditional_writes(store: Store) -> None:
    """Refuse (one line) a store that ignores the conditional puts the commit and the lease rely on: a probe object
    created twice with ``If-None-Match: *`` (the second must fail), then deleted; once per process and bucket."""
    if store.root.url in _probed:
        return
    probe = f"{UPLOADS}/.probe-{uuid.uuid4().hex}"
    stale = '"00000000000000000000000000000000"'
    try:
        first, second = store.create(probe, b"1"), store.create(probe, b"2")
        replaced, removed = store.replace(probe, b"3", stale), store.remove(probe, stale)
    finally:
        store.remove(probe)
    if first is None or second is not None or replaced is not None or removed:
        raise LakeError(
            f"the object store of {store.root.url} ignores conditional writes (If-None-Match, If-Match), on which a "
            "commit and the writer lease rely: use a store that honours them (AWS S3, MinIO, ...) or a local root"
        )
    _probed.add(store.root.url)


def checked_changeset(changeset: dict[str, Any], run_id: str, url: str) -> dict[str, Any] | None:
    """A changeset object read from the bucket, if it is one this lake wrote for ``run_id`` (its files synced
    files of that run), with ``run`` set; else None."""
    iteration, put, deletes = changeset.get("iteration"), changeset.get("put"), changeset.get("delete", [])
    if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
        return None
    if not isinstance(put, dict) or not all(isinstance(v, int) for v in put.values()) or not isinstance(deletes, list):
        return None
    names = [*put, *deletes]
    if not all(isinstance(n, str) and synced(checked_relative(n, url)) and run_of(n) == run_id for n in names):
        return None
    rewrite = changeset.get("rewrite") is True
    if rewrite and not all(rows_iteration(n) is not None for n in names):  # a rewrite changes row files only
        return None
    return {"iteration": iteration, "put": put, "delete": deletes, "run": run_id, "rewrite": rewrite}
