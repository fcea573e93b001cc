"""A data root in an object store, worked on through a local copy.

The bucket (``s3://bucket/prefix``) is the lake's truth; every command works in a local copy of it (a folder of
``RAGEN_OBJECT_CACHE``, default ``~/.cache/ragen/objects/<bucket>/<prefix>``) with the lake's own POSIX rules
(:mod:`ragen_core.storage.lake`), and the copy and the bucket meet at three points:

- **Opening** (:func:`open_store_root`): the copy gets every object it lacks or holds in an older version (by entity
  tag), and nothing is written to the bucket. An iteration committed in the bucket but not yet applied (below) is
  read from its uploads.
- **Taking a run to write it** (:meth:`StoreCopy.take_run`, from the writer lock): the run's lease object is claimed
  (:mod:`ragen_core.storage.storelease`); a committed iteration left unapplied by a writer that died is applied;
  uploads no commit names (a writer that died before its commit) are deleted; the copy's files of the run are made
  the bucket's (what the bucket no longer holds goes).
- **Committing an iteration** (:meth:`StoreCopy.commit`): every file of the run that changed since the last commit
  (the iteration's parts and their records, checkpoints, the manifest, ...) is uploaded under
  ``_uploads/<run>/<token>/`` — names no reader counts — with a changeset listing them and the files to delete;
  then the commit object ``_commits/<run>/iteration=<n>.json`` is created with ``If-None-Match: *``, naming the
  changeset. That put is the commit: of two writers only one creates it, and the other stops in one line. Then the
  changeset is applied (server-side copies to the files' own names, deletes) and its uploads removed; a writer that
  dies in the middle leaves an iteration that the next opening reads from its uploads and the next writer applies.

What the bucket never holds: the staging area, locks and leases of the copy, the Prefect homes, and the working
folders of a run's processes (update group, vLLM server, sampler). Nothing about credentials is written to the
copy or the bucket: only the URL.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ragen_core.faults import maybe_fail
from ragen_core.storage import layout
from ragen_core.storage.files import TRASH_PREFIX, LakeError, atomic_write_json
from ragen_core.storage.objectstore import Listed, Store, StoreRoot, parse_root

CACHE_ENV = "RAGEN_OBJECT_CACHE"
STATE_FILE = "_object_store.json"  # in the copy: the bucket's URL and what the copy holds of it
STATE_LOCK = ".object_store.lock"
UPLOADS = "_uploads"  # in the bucket: _uploads/<run>/<token>/<lake path> and _uploads/<run>/<token>.json
STORE_KEY = "_object_store"  # in a commit object: {"changeset": token}; never in the copy's commit marker
_NOT_SYNCED_TOP = {layout.STAGING, layout.LOCKS, layout.PREFECT, STATE_FILE, STATE_LOCK, UPLOADS}
_NOT_SYNCED_IN_RUN = {layout.WRITER_LOCK, layout.WRITER_LEASE, layout.SPACE_RESERVE, layout.UPDATE_GROUP}
_NOT_SYNCED_IN_RUN |= {layout.VLLM_SERVER, layout.SAMPLER}
_SCRATCH = re.compile(r"\..+\.(tmp|download)-\d+")
_COMMIT_OBJECT = re.compile(rf"{layout.COMMITS}/([^/]+)/{re.escape(layout.KEYED_ITERATION)}(\d+)\.json")


def cache_folder(root: StoreRoot) -> Path:
    """The local copy of ``root``: ``<base>/<bucket>/<prefix>`` (the bucket's top: ``<bucket>/_top``), the base
    ``$RAGEN_OBJECT_CACHE``, else ``objects/`` in the user's cache folder (``$RAGEN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/ragen``, else ``~/.cache/ragen``)."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        cache = os.environ.get("RAGEN_CACHE_DIR") or str(
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragen"
        )
        base = str(Path(cache) / "objects")
    return Path(base).expanduser().resolve() / root.bucket / (root.prefix or "_top")


_UNSAFE = re.compile(r"[\\\x00-\x1f\x7f]")


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


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def synced(relative: str) -> bool:
    """Whether the lake path ``relative`` lives in the bucket (else it is the copy's own: staging, locks, ...)."""
    parts = relative.split("/")
    if parts[0] in _NOT_SYNCED_TOP or _SCRATCH.fullmatch(parts[-1]) or any(p.startswith(TRASH_PREFIX) for p in parts):
        return False
    return not (parts[0] == layout.RUNS and len(parts) > 2 and parts[2] in _NOT_SYNCED_IN_RUN)


def run_of(relative: str) -> str | None:
    """The run a lake path belongs to (its rows, commits, manifest, checkpoints, quarantine), or None (models,
    sweeps, the layout file)."""
    parts = relative.split("/")
    if len(parts) < 3:
        return None
    if parts[0] in (layout.COMMITS, layout.RUNS):
        return parts[1]
    if parts[0] == layout.QUARANTINE and parts[1].startswith(layout.QUARANTINE_RUN_PREFIX):
        return parts[1][len(layout.QUARANTINE_RUN_PREFIX) :]
    if parts[1].startswith(layout.RUN_FOLDER_PREFIX) and not parts[0].startswith("_"):
        return parts[1][len(layout.RUN_FOLDER_PREFIX) :]
    return None


TRANSFERS = 8  # requests a copy sends to the store at once (uploads, downloads, copies, deletes)


def _each(work: Any, items: list[Any]) -> list[Any]:
    """``work(item)`` for every item, :data:`TRANSFERS` at a time (each is a request to the store, which waits on
    the network); their results in order; the first failure raised."""
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(TRANSFERS, len(items))) as pool:
        return list(pool.map(work, items))


def for_tables(relative: str, models: bool = False) -> bool:
    """Whether a lake path is one the tables and the ``runs`` listing read (not a run's checkpoint or log; a model
    only with ``models``)."""
    parts = relative.split("/")
    if parts[0] == layout.MODELS:
        return models
    return not (parts[0] == layout.RUNS and len(parts) > 2 and parts[2] != layout.MANIFEST)


class StoreCopy:
    """The local copy at ``folder`` of the data root ``store.root``."""

    def __init__(self, store: Store, folder: Path) -> None:
        self.store, self.folder = store, folder
        self.leases: dict[str, Any] = {}

    # -- the copy's record of what it holds -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The copy's state, under an exclusive lock (two commands of this host share a copy): ``objects`` (lake
        path -> the tag of the object the copy's file came from or went to) and ``files`` (lake path -> the size
        and mtime the file had then). Saved when the block ends."""
        with open(self.folder / STATE_LOCK, "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            path = self.folder / STATE_FILE
            state = _json(path.read_bytes()) if path.is_file() else {}  # damaged: the copy is fetched again
            state.setdefault("objects", {})
            state.setdefault("files", {})
            state["url"] = self.store.root.url
            yield state
            atomic_write_json(path, state)

    def _stamp(self, state: dict[str, Any], relative: str, etag: str) -> None:
        stat = (self.folder / relative).stat()
        state["objects"][relative] = etag
        state["files"][relative] = [stat.st_size, stat.st_mtime_ns]

    def _unchanged(self, state: dict[str, Any], relative: str) -> bool:
        try:
            stat = (self.folder / relative).stat()
        except FileNotFoundError:
            return False
        return state["files"].get(relative) == [stat.st_size, stat.st_mtime_ns]

    def local_files(self, run_id: str | None) -> dict[str, os.stat_result]:
        """The copy's synced files of ``run_id`` (its partitions in every table folder, commits, manifest and run
        folder, quarantine), or, for None, those of no run (models, sweeps, the layout file), by lake path: only
        those folders are walked, so a commit's cost does not grow with the other runs of the copy."""
        tops = sorted(p.name for p in self.folder.iterdir() if synced(p.name)) if self.folder.is_dir() else []
        if run_id is None:
            starts = [t for t in tops if not (self.folder / t).is_dir() or t in (layout.MODELS, layout.SWEEPS)]
        else:
            starts = [f"{t}/{layout.RUN_FOLDER_PREFIX}{run_id}" for t in tops if not t.startswith("_")]
            starts += [f"{layout.COMMITS}/{run_id}", f"{layout.RUNS}/{run_id}"]
            starts.append(f"{layout.QUARANTINE}/{layout.QUARANTINE_RUN_PREFIX}{run_id}")
        found = {}
        for start in starts:
            if (self.folder / start).is_file():
                found[start] = os.stat(self.folder / start)
            for folder, folders, files in os.walk(self.folder / start):
                base = Path(folder).relative_to(self.folder).as_posix()
                folders[:] = [f for f in folders if synced(f"{base}/{f}")]
                for name in files:
                    relative = f"{base}/{name}"
                    if synced(relative) and run_of(relative) == run_id:
                        found[relative] = os.stat(self.folder / relative)
        return found

    # -- reading the bucket -----------------------------------------------------------------------------------------
    def pending(self, listing: dict[str, Listed], run_id: str | None = None) -> dict[str, dict[str, Any]]:
        """The committed changesets not yet applied (their changeset object still there), by token: the changeset
        (``run``, ``iteration``, ``put``: lake path -> size, ``delete``)."""
        found = {}
        for relative in listing:
            parts = relative.split("/")
            if parts[0] != UPLOADS or len(parts) != 3 or not parts[2].endswith(".json"):
                continue
            if run_id is not None and parts[1] != run_id:
                continue
            token = parts[2][: -len(".json")]
            read = self.store.read(relative)
            changeset = _json(read[0]) if read else {}
            iteration, put = changeset.get("iteration"), changeset.get("put")
            deletes = changeset.get("delete", [])
            sizes_ok = isinstance(put, dict) and all(isinstance(size, int) for size in put.values())
            if not isinstance(iteration, int) or iteration < 0 or not sizes_ok or not isinstance(deletes, list):
                continue  # not a changeset this lake wrote: never applied, never read
            for name in [*put, *deletes]:
                checked_relative(str(name), self.store.root.url)
            commit = self.store.read(f"{layout.COMMITS}/{parts[1]}/{layout.commit_marker_name(iteration)}")
            named = _json(commit[0]).get(STORE_KEY) if commit is not None else None
            if isinstance(named, dict) and named.get("changeset") == token:
                found[token] = {**changeset, "run": parts[1], "committed": True}
            else:
                found[token] = {**changeset, "run": parts[1], "committed": False}
        return found

    def pull(self, run_id: str | None = None, exact: bool = False, only: str | None = None) -> int:
        """Download what the copy lacks or holds in an older version (of ``run_id`` only, when given; ``only="read"``:
        what the tables and the runs' manifests need; ``only="write"``: those and the models, the runs' checkpoints
        coming with :meth:`take_run`, each run's to its writer); with ``exact``,
        also remove the copy's files of that run that the bucket no longer holds. Committed changesets not yet
        applied are read from their uploads. Returns how many files were downloaded."""
        listing = self.store.listing()
        pending = [c for c in self.pending(listing, run_id).items() if c[1]["committed"]]
        fetched, wanted = 0, []
        with self._state() as state:
            for relative, listed in sorted(listing.items()):
                checked_relative(relative, self.store.root.url)
                if not synced(relative) or (run_id is not None and run_of(relative) != run_id):
                    continue
                if only is not None and not for_tables(relative, models=only == "write"):
                    continue
                if state["objects"].get(relative) == listed.etag and self._held(relative):
                    continue
                wanted.append((relative, relative))
            for token, changeset in pending:
                for relative in [r for r in changeset["put"] if only is None or for_tables(r, only == "write")]:
                    upload = f"{UPLOADS}/{changeset['run']}/{token}/{relative}"
                    if upload in listing and state["objects"].get(relative) != listing[upload].etag:
                        wanted.append((upload, relative))
            for (_, relative), etag in zip(wanted, _each(self._download, wanted), strict=True):
                if etag is not None:
                    self._stamp(state, relative, etag)
                    fetched += 1
            if exact and run_id is not None:
                held = set(listing) | {r for _, c in pending for r in c["put"]}
                for relative in [r for r in state["objects"] if run_of(r) == run_id and r not in held]:
                    (self.folder / relative).unlink(missing_ok=True)
                    state["objects"].pop(relative, None)
                    state["files"].pop(relative, None)
        return fetched

    def _held(self, relative: str) -> bool:
        """Whether the copy has a file at ``relative`` (the caller knows that its object is unchanged since the file
        was pulled or pushed): one changed here since is a local writer's work not yet pushed (a run's manifest
        between its write and its upload, a part before its commit), which a pull never overwrites."""
        return (self.folder / relative).is_file()

    def _download(self, pair: tuple[str, str]) -> str | None:
        """Download the object ``source`` to the copy's file ``relative``; its tag, or None when it is gone."""
        source, relative = pair
        target = self.folder / relative
        etag = self.store.download(source, target)
        if etag is None:
            return None
        match = _COMMIT_OBJECT.fullmatch(relative)
        if match:  # the copy's commit marker is the lake's payload, without the bucket's changeset
            payload = _json(target.read_bytes())
            if STORE_KEY in payload:
                payload.pop(STORE_KEY)
                atomic_write_json(target, payload)
        return etag

    # -- writing a run ----------------------------------------------------------------------------------------------
    def take_run(self, holder: dict[str, Any], refuse: Any, wait: bool) -> tuple[Any, dict[str, Any] | None]:
        """Claim the run's lease object, apply its committed changesets, delete its uploads no commit names, and
        make the copy's files of the run the bucket's; (the lease, a stale lease's record taken over)."""
        from ragen_core.storage.storelease import claim_store_lease

        run_id = holder["run_id"]
        lease, taken = claim_store_lease(self.store, holder, refuse, wait)
        try:
            for token, changeset in self.pending(self.store.listing(f"{UPLOADS}/{run_id}"), run_id).items():
                if changeset["committed"]:
                    self._apply(token, changeset)
                else:
                    self._drop(run_id, token)
            self._drop_orphans(run_id)
            self.pull(run_id, exact=True)
        except BaseException:
            lease.release()
            raise
        self.leases[run_id] = lease
        return lease, taken

    def _drop(self, run_id: str, token: str) -> None:
        _each(self.store.remove, sorted(self.store.listing(f"{UPLOADS}/{run_id}/{token}/")))
        self.store.remove(f"{UPLOADS}/{run_id}/{token}.json")

    def _drop_orphans(self, run_id: str) -> None:
        """Uploads of the run that no changeset object names (a writer died while uploading, before its changeset
        was written)."""
        listing = self.store.listing(f"{UPLOADS}/{run_id}/")
        named = {r.split("/")[2][: -len(".json")] for r in listing if r.count("/") == 2 and r.endswith(".json")}
        for relative in listing:
            parts = relative.split("/")
            if len(parts) > 3 and parts[2] not in named:
                self.store.remove(relative)

    def _apply(self, token: str, changeset: dict[str, Any]) -> dict[str, str]:
        """Copy a committed changeset's uploads to their own names, delete what it deletes, then remove its
        uploads (the changeset object last: while it is there, the next writer applies it again, which is safe);
        the copies' tags."""
        run_id = changeset["run"]
        uploaded = self.store.listing(f"{UPLOADS}/{run_id}/{token}/")
        present = [r for r in sorted(changeset["put"]) if f"{UPLOADS}/{run_id}/{token}/{r}" in uploaded]  # else: done
        put = changeset["put"]
        copied = _each(lambda r: self.store.copy(f"{UPLOADS}/{run_id}/{token}/{r}", r, int(put[r])), present)
        _each(self.store.remove, list(changeset.get("delete", [])))
        self._drop(run_id, token)
        return dict(zip(present, copied, strict=True))

    def commit(self, run_id: str, iteration: int, payload: dict[str, Any]) -> None:
        """Publish the run's changes in the bucket as the commit of ``iteration`` (module docstring); a
        :class:`LakeError` of one line when another writer committed it first."""
        lease = self.leases.get(run_id)
        if lease is not None:
            lease.check()
        token = uuid.uuid4().hex
        with self._state() as state:
            files = self.local_files(run_id)
            marker = f"{layout.COMMITS}/{run_id}/{layout.commit_marker_name(iteration)}"
            changed = sorted(r for r in files if not _COMMIT_OBJECT.fullmatch(r) and not self._unchanged(state, r))
            deleted = sorted(r for r in state["files"] if run_of(r) == run_id and r not in files)
            deleted = [r for r in deleted if not _COMMIT_OBJECT.fullmatch(r)]

            def upload(relative: str) -> str:
                return self.store.upload(self.folder / relative, f"{UPLOADS}/{run_id}/{token}/{relative}")

            _each(upload, changed[: len(changed) // 2])
            maybe_fail("store", "mid_upload", iteration)  # half the changeset uploaded, nothing committed
            _each(upload, changed[len(changed) // 2 :])
            changeset = {"iteration": iteration, "put": {r: files[r].st_size for r in changed}, "delete": deleted}
            self.store.write(f"{UPLOADS}/{run_id}/{token}.json", json.dumps(changeset, sort_keys=True).encode())
            data = json.dumps({**payload, STORE_KEY: {"changeset": token}}, sort_keys=True).encode()
            etag = self.store.create(marker, data)
            if etag is None:
                self._drop(run_id, token)
                raise LakeError(
                    f"iteration {iteration} of run {run_id!r} was committed in {self.store.root.url} by another "
                    "writer: this one stops and counts nothing of it (`ragen resume` goes on from the bucket)"
                )
            maybe_fail("store", "committed", iteration)  # committed in the bucket, not yet applied nor in the copy
            tags = self._apply(token, {**changeset, "run": run_id})
            for relative in changed:
                self._stamp(state, relative, tags.get(relative, ""))
            for relative in deleted:
                state["objects"].pop(relative, None)
                state["files"].pop(relative, None)
            state["objects"][marker] = etag

    def withdraw(self, run_id: str, iteration: int) -> None:
        """Delete the commit object of ``iteration`` (a run extended past its final validation reopens it), only
        while it still holds what this copy pulled or created; a :class:`LakeError` when another writer changed it."""
        lease = self.leases.get(run_id)
        if lease is not None:
            lease.check()
        marker = f"{layout.COMMITS}/{run_id}/{layout.commit_marker_name(iteration)}"
        with self._state() as state:
            current = self.store.read(marker)
            if current is not None and not self.store.remove(marker, current[1]):
                raise LakeError(
                    f"the commit of iteration {iteration} of run {run_id!r} in {self.store.root.url} changed while it "
                    "was withdrawn: another writer holds the run; try again once it is done"
                )
            state["objects"].pop(marker, None)
            state["files"].pop(marker, None)

    def push_loose(self, run_id: str | None) -> None:
        """Put the files outside any run that changed (models, sweeps, the layout file) and, for ``run_id``, its
        manifest: written between commits (a run's start and end). A run's other files go with its commits."""
        lease = self.leases.get(run_id) if run_id else None
        if lease is not None:
            lease.check()
        with self._state() as state:
            wanted = dict(self.local_files(None))
            if run_id is not None:
                manifest = f"{layout.RUNS}/{run_id}/{layout.MANIFEST}"
                if (self.folder / manifest).is_file():
                    wanted[manifest] = (self.folder / manifest).stat()
            for relative in sorted(wanted):
                if not self._unchanged(state, relative):
                    etag = self.store.upload(self.folder / relative, relative)
                    self._stamp(state, relative, etag)
            if run_id is not None:  # the run's folder files it removed since (a checkpoint an undone extension made)
                folder = f"{layout.RUNS}/{run_id}/"
                for relative in [r for r in state["files"] if r.startswith(folder)]:
                    if not (self.folder / relative).exists():
                        self.store.remove(relative)
                        state["objects"].pop(relative, None)
                        state["files"].pop(relative, None)

    def release_run(self, run_id: str) -> None:
        lease = self.leases.pop(run_id, None)
        if lease is not None:
            lease.release()


_copies: dict[Path, StoreCopy | None] = {}
_copies_guard = threading.Lock()


def store_copy(root: Path) -> StoreCopy | None:
    """The :class:`StoreCopy` whose local folder is ``root``, or None when ``root`` is a plain data root."""
    root = Path(root).resolve()
    with _copies_guard:
        if root not in _copies:
            state = root / STATE_FILE
            copy = None
            if state.is_file():
                url = _json(state.read_bytes()).get("url")
                if not isinstance(url, str):
                    raise LakeError(f"{str(state)!r} names no object store: delete the local copy {str(root)!r}")
                copy = StoreCopy(Store(parse_root(url)), root)
            _copies[root] = copy
        return _copies[root]


def open_store_root(url: str, only: str | None = None) -> Path:
    """The local copy of the data root ``url`` (``s3://bucket/prefix``), brought up to date with the bucket
    (downloads only; ``only``: see :meth:`StoreCopy.pull`); its folder, which commands then use as their data
    root."""
    root = parse_root(url)
    store = Store(root)
    store.check_bucket()
    folder = cache_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / STATE_FILE
    if state.is_file() and _json(state.read_bytes()).get("url") not in (root.url, None):
        raise LakeError(f"the local copy {str(folder)!r} belongs to another data root; set {CACHE_ENV} elsewhere")
    copy = StoreCopy(store, folder)
    copy.pull(only=only)
    with _copies_guard:
        _copies[folder] = copy
    return folder
