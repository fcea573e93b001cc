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
  The stage records of later iterations (an async run's batches sampled ahead, which the commit waited for) go
  with it, so a writer on another host keeps those batches.
- **Rewriting committed files** (:meth:`StoreCopy.rewrite`, ``ragen runs compact``): the same changeset, committed
  by creating ``_uploads/<run>/<token>.committed`` instead of an iteration's commit object.

What the bucket never holds: the staging area (but its stage records), locks and leases of the copy, the Prefect
homes, and the working folders of a run's processes (update group, vLLM server, sampler). Nothing about
credentials is written to the copy or the bucket: only the URL.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from ragen_core.faults import maybe_fail
from ragen_core.storage import layout
from ragen_core.storage.files import LakeError, atomic_write_json
from ragen_core.storage.objectstore import Store, parse_root
from ragen_core.storage.storenames import (
    CACHE_ENV,
    COMMIT_OBJECT,
    REWRITE_COMMITTED,
    STATE_FILE,
    STORE_KEY,
    UPLOADS,
    as_json,
    cache_folder,
    check_conditional_writes,
    each,
    old_layout_run,
    rows_iteration,
    run_of,
    stage_record,
)
from ragen_core.storage.storeread import CopyReader

__all__ = ["UPLOADS", "StoreCopy", "open_store_root", "store_copy"]


class StoreCopy(CopyReader):
    """The local copy at ``folder`` of the data root ``store.root``, and its writes to the bucket (reading it:
    :class:`~ragen_core.storage.storeread.CopyReader`)."""

    # -- writing a run ----------------------------------------------------------------------------------------------
    def take_run(self, holder: dict[str, Any], refuse: Any, wait: bool) -> tuple[Any, dict[str, Any] | None]:
        """Claim the run's lease object, apply its committed changesets, delete the changesets another commit
        superseded and the uploads no changeset names, and make the copy's files of the run the bucket's; (the
        lease, a stale lease's record taken over). A changeset of an iteration nobody committed stays: its writer
        (one whose lease expired, say) may still commit it, and the next writer after that commit deletes it. A
        rewrite nobody committed is aborted (:meth:`_abort_rewrite`) and deleted."""
        from ragen_core.storage.storelease import claim_store_lease

        run_id = holder["run_id"]
        check_conditional_writes(self.store)
        lease, taken = claim_store_lease(self.store, holder, refuse, wait)
        try:
            for token, changeset in self.changesets(self.store.listing(f"{UPLOADS}/{run_id}/"), run_id).items():
                if changeset["rewrite"] and not changeset["committed"] and not changeset["superseded"]:
                    changeset = self._abort_rewrite(run_id, token, changeset)
                if changeset["committed"]:
                    self._apply(token, changeset)
                elif changeset["superseded"]:
                    self._drop(run_id, token)
            self._drop_orphans(run_id)
            self.pull(run_id, exact=True)
        except BaseException:
            lease.release()
            raise
        self.leases[run_id] = lease
        return lease, taken

    def _abort_rewrite(self, run_id: str, token: str, changeset: dict[str, Any]) -> dict[str, Any]:
        """Abort a rewrite nobody committed (its writer died, or lost the run to this one): create its commit object
        first, as aborted, so its writer's create fails and it stops; when its writer created it first, the rewrite
        is committed. The changeset with its fate."""
        aborted = json.dumps({"aborted": uuid.uuid4().hex}).encode()
        if self.store.create(f"{UPLOADS}/{run_id}/{token}{REWRITE_COMMITTED}", aborted) is not None:
            return {**changeset, "superseded": True}
        fate = self._rewrite_fate(run_id, token)
        return {**changeset, "committed": fate == "committed", "superseded": fate == "aborted"}

    def _drop_superseded(self, run_id: str) -> None:
        """After a commit: delete the run's changesets that a commit of their iteration superseded (a writer's that
        died or was refused), so that a run finished after a crash leaves no uploads behind."""
        for token, changeset in self.changesets(self.store.listing(f"{UPLOADS}/{run_id}/"), run_id).items():
            if changeset["superseded"]:
                self._drop(run_id, token)

    def _drop(self, run_id: str, token: str) -> None:
        """Delete a changeset: its uploads, then its object (while that is there, its uploads are known)."""
        each(self.store.remove, sorted(self.store.listing(f"{UPLOADS}/{run_id}/{token}/")))
        self.store.remove(f"{UPLOADS}/{run_id}/{token}.json")
        self.store.remove(f"{UPLOADS}/{run_id}/{token}{REWRITE_COMMITTED}")  # a rewrite's (if any), the last

    def _drop_orphans(self, run_id: str) -> None:
        """Uploads of the run that no changeset object names: a changeset object is written before its uploads, so
        these are what a writer uploaded after its changeset was deleted (superseded), never read."""
        listing = self.store.listing(f"{UPLOADS}/{run_id}/")
        named = {r.split("/")[2][: -len(".json")] for r in listing if r.count("/") == 2 and r.endswith(".json")}
        each(self.store.remove, [r for r in sorted(listing) if r.count("/") > 2 and r.split("/")[2] not in named])
        ends = [r for r in listing if r.endswith(REWRITE_COMMITTED) and r.count("/") == 2]
        each(self.store.remove, [r for r in ends if r.split("/")[2][: -len(REWRITE_COMMITTED)] not in named])

    def _apply(self, token: str, changeset: dict[str, Any]) -> dict[str, str]:
        """Copy a committed changeset's uploads to their own names, delete what it deletes, then remove its
        uploads (the changeset object last: while it is there, the next writer applies it again, which is safe);
        the copies' tags. An upload already applied and removed is one whose own name holds its size."""
        run_id, put = changeset["run"], changeset["put"]
        uploaded = self.store.listing(f"{UPLOADS}/{run_id}/{token}/")
        present = [r for r in sorted(put) if f"{UPLOADS}/{run_id}/{token}/{r}" in uploaded]
        for relative in sorted(set(put) - set(present)):
            if self.store.listing(relative).get(relative) is None:  # neither uploaded nor applied
                raise LakeError(
                    f"the commit of iteration {changeset['iteration']} of run {run_id!r} in {self.store.root.url} "
                    f"names {relative!r}, which neither its uploads nor the bucket hold: the bucket was changed by "
                    "hand; restore that object, then try again"
                )
        copied = each(lambda r: self.store.copy(f"{UPLOADS}/{run_id}/{token}/{r}", r, int(put[r])), present)
        each(self.store.remove, list(changeset["delete"]))
        self._drop(run_id, token)
        return dict(zip(present, copied, strict=True))

    def commit(self, run_id: str, iteration: int, payload: dict[str, Any]) -> None:
        """Publish the run's changes in the bucket as the commit of ``iteration`` (module docstring); a
        :class:`LakeError` of one line when another writer committed it first."""
        lease = self._checked_lease(run_id)
        token = uuid.uuid4().hex
        with self._state() as state:
            files, changeset = self._changes(state, run_id, iteration)
            self._send(run_id, token, changeset, files)
            if lease is not None:
                lease.check()  # once more, just before the commit
            marker = f"{layout.COMMITS}/{run_id}/{layout.commit_marker_name(iteration)}"
            data = json.dumps({**payload, STORE_KEY: {"changeset": token}}, sort_keys=True).encode()
            etag = self.store.create(marker, data)
            if etag is None:
                self._drop(run_id, token)
                raise LakeError(
                    f"iteration {iteration} of run {run_id!r} was committed in {self.store.root.url} by another "
                    "writer: this one stops and counts nothing of it (`ragen resume` goes on from the bucket)"
                )
            maybe_fail("store", "committed", iteration)  # committed in the bucket, not yet applied nor in the copy
            self._settle(state, run_id, token, changeset, files)
            (self.folder / marker).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.folder / marker, payload)  # the copy's marker: the lake's payload alone
            self._stamp(state, marker, etag)
            self._drop_superseded(run_id)

    def rewrite(self, run_id: str, every_iteration: bool = False) -> int:
        """Publish a rewrite of the run's committed files (``ragen runs compact``: the merged parts, the partitions'
        records and markers, the parts they replace) as one changeset, committed by creating its own commit object
        (``_uploads/<run>/<token>.committed``) once every file is uploaded: a reader sees the files before the
        rewrite or after it, never a mix; a kill before that object leaves the bucket as it was, and a writer that
        takes the run meanwhile aborts the rewrite by creating that object first (this one then stops in one line).
        Only row files of committed iterations change (``every_iteration``: of every iteration the copy holds rows
        of, ``ragen upgrade-lake`` moving the bucket's layout-1 files). The caller holds the run's lease. Returns how
        many files it put or deleted."""
        lease = self._checked_lease(run_id)
        if lease is None:
            raise LakeError(f"run {run_id!r} in {self.store.root.url} is rewritten only under its writer lease")
        files = self.local_files(run_id)
        iterations = {int(m.group(2)) for m in map(COMMIT_OBJECT.fullmatch, files) if m}
        if every_iteration:
            iterations |= {rows_iteration(r) for r in files} - {None}
        token = uuid.uuid4().hex
        with self._state() as state:
            files, changeset = self._changes(state, run_id, max(iterations, default=0), frozenset(iterations))
            if not changeset["put"] and not changeset["delete"]:
                return 0
            self._send(run_id, token, changeset, files)
            lease.check()  # once more, just before the commit
            self._commit_rewrite(run_id, token)
            maybe_fail("store", "rewritten", None)  # committed in the bucket, not yet applied nor in the copy
            self._settle(state, run_id, token, changeset, files)
        return len(changeset["put"]) + len(changeset["delete"])

    def _commit_rewrite(self, run_id: str, token: str) -> None:
        """Create the rewrite's commit object; a :class:`LakeError` when a writer that took the run aborted it
        (created that object first, or already deleted the aborted changeset: its object then goes again)."""
        commit = f"{UPLOADS}/{run_id}/{token}{REWRITE_COMMITTED}"
        created = self.store.create(commit, json.dumps({"rewrite": token}).encode())
        if created is not None and self.store.read(f"{UPLOADS}/{run_id}/{token}.json") is not None:
            return
        if created is not None:  # the taker deleted the changeset (its object before this one): never applied
            self.store.remove(commit)
        else:
            self._drop(run_id, token)
        raise LakeError(
            f"another writer took run {run_id!r} in {self.store.root.url} while this command rewrote its files: the "
            "rewrite was withdrawn, nothing of it counts; run the command again"
        )

    def _checked_lease(self, run_id: str) -> Any:
        """The lease this copy holds on ``run_id`` (checked: a writer whose lease was taken over stops), or None."""
        lease = self.leases.get(run_id)
        if lease is not None:
            lease.check()
        return lease

    def _changes(
        self, state: dict[str, Any], run_id: str, iteration: int, rewritten: frozenset[int] | None = None
    ) -> tuple[dict[str, os.stat_result], dict[str, Any]]:
        """The run's files (each as it was listed: one changed meanwhile goes again) and the changeset of what
        changed since the last commit: ``put`` (lake path -> size) and ``delete``. The stage records of
        ``iteration`` and earlier ones end with its commit (its staging goes once committed); those of later ones
        (an async run's batches sampled ahead, which this commit waited for) go with it. A rewrite (of the committed
        iterations ``rewritten``) puts and deletes only their row files: parts, the partitions' compaction markers
        and their records of their parts."""
        files = self.local_files(run_id)
        records = {r: stage_record(r) for r in {*files, *state["files"]} if run_of(r) == run_id}
        done = {r for r, n in records.items() if n is not None and n <= iteration and rewritten is None}

        def kept(relative: str) -> bool:  # never a commit object; a rewrite's: row files of committed iterations
            return not COMMIT_OBJECT.fullmatch(relative) and (
                rewritten is None or rows_iteration(relative) in rewritten
            )

        changed = sorted(r for r in files if kept(r) and r not in done and not self._unchanged(state, r))
        deleted = sorted(r for r in state["files"] if run_of(r) == run_id and (r not in files or r in done))
        deleted = [r for r in deleted if kept(r)]
        changeset = {"iteration": iteration, "put": {r: files[r].st_size for r in changed}, "delete": deleted}
        return files, {**changeset, "rewrite": True} if rewritten is not None else changeset

    def _send(self, run_id: str, token: str, changeset: dict[str, Any], files: dict[str, os.stat_result]) -> None:
        """Write the changeset object, then upload its files under ``_uploads/<run>/<token>/`` (a file removed
        since it was listed leaves the changeset, which is written again)."""
        # the changeset first: every upload then belongs to an iteration a later writer can judge
        self.store.write(f"{UPLOADS}/{run_id}/{token}.json", json.dumps(changeset, sort_keys=True).encode())

        def upload(relative: str) -> str | None:
            try:
                return self.store.upload(self.folder / relative, f"{UPLOADS}/{run_id}/{token}/{relative}")
            except FileNotFoundError:  # removed since it was listed (a redo discarding a stage's files)
                return None

        changed = list(changeset["put"])
        sent = each(upload, changed[: len(changed) // 2])
        maybe_fail("store", "mid_upload", changeset["iteration"])  # half the changeset uploaded, nothing committed
        sent += each(upload, changed[len(changed) // 2 :])
        gone = [r for r, tag in zip(changed, sent, strict=True) if tag is None]
        if gone:  # the changeset names what was uploaded; the vanished files go at the next commit
            changeset["put"] = {r: files[r].st_size for r in changed if r not in gone}
            self.store.write(f"{UPLOADS}/{run_id}/{token}.json", json.dumps(changeset, sort_keys=True).encode())

    def _settle(
        self, state: dict[str, Any], run_id: str, token: str, changeset: dict[str, Any], files: dict[str, Any]
    ) -> None:
        """Apply a changeset this copy committed, and record its files in the copy's state as the bucket's."""
        tags = self._apply(token, {**changeset, "run": run_id})
        for relative in changeset["put"]:
            self._stamp(state, relative, tags.get(relative, ""), files[relative])
        for relative in changeset["delete"]:
            self._forget(state, relative)

    def withdraw(self, run_id: str, iteration: int) -> None:
        """Delete the commit object of ``iteration`` (a run extended past its final validation reopens it), only
        while it is the one this copy pulled or created; a :class:`LakeError` when another writer changed it."""
        lease = self.leases.get(run_id)
        if lease is not None:
            lease.check()
        marker = f"{layout.COMMITS}/{run_id}/{layout.commit_marker_name(iteration)}"
        with self._state() as state:
            held = state["objects"].get(marker)
            if held is None or not self.store.remove(marker, held):
                raise LakeError(
                    f"the commit of iteration {iteration} of run {run_id!r} in {self.store.root.url} is not the one "
                    "this copy holds: another writer changed the run; resume it again"
                )
            self._forget(state, marker)

    def push_loose(self, run_id: str | None) -> None:
        """Put the files outside any run that changed (models, sweeps, the layout file) and, for ``run_id``, its
        manifest: written between commits (a run's start and end). A run's other files go with its commits. A
        model folder's files are put only where the bucket has none (a model's folder is named by what it holds)."""
        lease = self.leases.get(run_id) if run_id else None
        if lease is not None:
            lease.check()
        with self._state() as state:
            wanted = dict(self.local_files(None))
            if run_id is not None:
                manifest = f"{layout.RUNS}/{run_id}/{layout.MANIFEST}"
                if (self.folder / manifest).is_file():
                    wanted[manifest] = (self.folder / manifest).stat()
            for relative in sorted(r for r in wanted if not self._unchanged(state, r)):
                there = (
                    self.store.listing(relative).get(relative) if relative.startswith(f"{layout.MODELS}/") else None
                )
                etag = there.etag if there is not None else self.store.upload(self.folder / relative, relative)
                self._stamp(state, relative, etag, wanted[relative])
            if run_id is not None:  # the run's folder files it removed since (a checkpoint an undone extension made)
                folder = f"{layout.RUNS}/{run_id}/"
                for relative in [r for r in state["files"] if r.startswith(folder)]:
                    if not (self.folder / relative).exists():
                        self.store.remove(relative)
                        self._forget(state, relative)

    def drop_old_layout(self) -> None:
        """Delete the bucket's files of lake layout 1 that the copy no longer holds (``ragen upgrade-lake`` moved
        them here and published each under its new name first), each only while it is the object the copy pulled,
        a partition's compaction marker after its parts (the upgrade derives the merged file's new name from it).
        A :class:`LakeError` when layout-1 files are left in the bucket (put or pulled back meanwhile): the upgrade
        is run again."""
        with self._state() as state:
            listing = self.store.listing()
            gone = [
                relative
                for relative, listed in sorted(listing.items())
                if old_layout_run(relative) is not None
                and state["objects"].get(relative) == listed.etag
                and not (self.folder / relative).exists()
            ]
            for batch in (
                [r for r in gone if not r.endswith(f"/{layout.OLD_COMPACTION_MARKER}")],
                [r for r in gone if r.endswith(f"/{layout.OLD_COMPACTION_MARKER}")],
            ):
                removed = each(lambda relative: self.store.remove(relative, listing[relative].etag), batch)
                for relative in [r for r, done in zip(batch, removed, strict=True) if done]:
                    self._forget(state, relative)
        left = sorted(r for r in self.store.listing() if old_layout_run(r) is not None)
        if left:
            raise LakeError(
                f"{len(left)} file(s) of the old lake layout are still in {self.store.root.url} (such as {left[0]!r}, "
                "put or pulled back while the upgrade ran); run `ragen upgrade-lake` again"
            )

    def remove_run(self, run_id: str, models: list[str]) -> None:
        """Delete the run's objects (``ragen runs rm``, holding its lease): its commit objects first (readers stop
        counting its rows), then its rows, records, uploads, quarantine, run folder and the ``models`` folders it
        owned, its manifest last; the lease object goes with the lease."""
        lease = self.leases.get(run_id)
        if lease is not None:
            lease.check()
        with self._state() as state:
            listing = self.store.listing()
            mine = [r for r in listing if run_of(r) == run_id or r.startswith(f"{UPLOADS}/{run_id}/")]
            mine += [r for r in listing if any(r.startswith(f"{model}/") for model in models)]
            manifest = f"{layout.RUNS}/{run_id}/{layout.MANIFEST}"
            commits = sorted(r for r in mine if COMMIT_OBJECT.fullmatch(r))
            rest = sorted(r for r in set(mine) - set(commits) if r != manifest and not _lease_object(r))
            for batch in (commits, rest, [manifest] if manifest in listing else []):
                each(self.store.remove, batch)
                for relative in batch:
                    self._forget(state, relative)

    def release_run(self, run_id: str) -> None:
        lease = self.leases.pop(run_id, None)
        if lease is not None:
            lease.release()


def _lease_object(relative: str) -> bool:
    parts = relative.split("/")
    return len(parts) == 3 and parts[0] == layout.RUNS and parts[2] == layout.STORE_LEASE


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
                url = as_json(state.read_bytes()).get("url")
                if not isinstance(url, str):
                    raise LakeError(f"{str(state)!r} names no object store: delete the local copy {str(root)!r}")
                copy = StoreCopy(Store(parse_root(url)), root)
            _copies[root] = copy
        return _copies[root]


def root_address(root: Path) -> str:
    """How another process or host names the data root ``root``: its bucket's URL when ``root`` is the local copy
    of one (each opens its own copy), else the folder's absolute path."""
    copy = store_copy(root)
    return copy.store.root.url if copy is not None else str(Path(root).resolve())


def share(root: Path) -> None:
    """Put the files of the local copy ``root`` that belong to no run and changed (a sweep's plan, a model) into its
    bucket, for the other hosts; nothing for a plain data root."""
    copy = store_copy(root)
    if copy is not None:
        copy.push_loose(None)


def refresh(root: Path, only: str | None = "read") -> None:
    """Bring the local copy ``root`` of a bucket up to date (``only``: see :meth:`StoreCopy.pull`), for a reader
    that waited while other hosts wrote (a sweep's points run by workers); nothing for a plain data root."""
    copy = store_copy(root)
    if copy is not None:
        copy.pull(only=only)


def open_store_root(url: str, only: str | None = None, tables: frozenset[str] | None = None) -> Path:
    """The local copy of the data root ``url`` (``s3://bucket/prefix``), brought up to date with the bucket
    (downloads only; ``only``, ``tables``: see :meth:`StoreCopy.pull`); its folder, which commands then use as their
    data root."""
    root = parse_root(url)
    store = Store(root)
    store.check_bucket()
    folder = cache_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / STATE_FILE
    if state.is_file() and as_json(state.read_bytes()).get("url") not in (root.url, None):
        raise LakeError(f"the local copy {str(folder)!r} belongs to another data root; set {CACHE_ENV} elsewhere")
    with _copies_guard:  # one per folder in a process: a run's lease held by it stays known
        copy = _copies.get(folder) or StoreCopy(store, folder)
        _copies[folder] = copy
    copy.pull(only=only, tables=tables)
    return folder
