"""How the local copy of a data root in an object store holds the bucket's files and gets them
(:class:`CopyReader`): the copy's record of what it holds (each file with the tag of the object it came from or went
to), the changesets a reader applies from their uploads, and the pull that brings the copy up to date. The writing
side (a run's lease, commits, rewrites) is :mod:`ragen_core.storage.storecopy`."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragen_core.storage import layout
from ragen_core.storage.files import LakeError, atomic_write_json
from ragen_core.storage.objectstore import Listed, Store
from ragen_core.storage.storenames import (
    COMMIT_OBJECT,
    REWRITE_COMMITTED,
    STATE_FILE,
    STATE_LOCK,
    STORE_KEY,
    UPLOADS,
    as_json,
    checked_changeset,
    checked_relative,
    each,
    folder_marker,
    for_tables,
    old_layout_run,
    rows_iteration,
    run_of,
    stage_record,
    staging_walked,
    synced,
)


class CopyReader:
    """The local copy at ``folder`` of the data root ``store.root``: what it holds, and how it gets the bucket's files
    (the writing side: :class:`~ragen_core.storage.storecopy.StoreCopy`)."""

    def __init__(self, store: Store, folder: Path) -> None:
        self.store, self.folder = store, folder
        self.leases: dict[str, Any] = {}

    # -- the copy's record of what it holds -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The copy's state, under an exclusive lock (two commands of this host share a copy; every exchange with
        the bucket happens under it): ``objects`` (lake path -> the tag of the object the copy's file came from or
        went to) and ``files`` (lake path -> the size and mtime the file had then). Saved when the block ends."""
        with open(self.folder / STATE_LOCK, "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            path = self.folder / STATE_FILE
            state = as_json(path.read_bytes()) if path.is_file() else {}  # damaged: the copy is fetched again
            state["objects"] = state.get("objects") if isinstance(state.get("objects"), dict) else {}
            state["files"] = state.get("files") if isinstance(state.get("files"), dict) else {}
            state["url"] = self.store.root.url
            yield state
            atomic_write_json(path, state)

    def _stamp(self, state: dict[str, Any], relative: str, etag: str, stat: os.stat_result | None = None) -> None:
        """Record that the copy's file ``relative`` (as ``stat`` saw it: the state it was uploaded in) is the object
        of tag ``etag``."""
        stat = stat or (self.folder / relative).stat()
        state["objects"][relative] = etag
        state["files"][relative] = [stat.st_size, stat.st_mtime_ns]

    def _forget(self, state: dict[str, Any], relative: str) -> None:
        state["objects"].pop(relative, None)
        state["files"].pop(relative, None)

    def _unchanged(self, state: dict[str, Any], relative: str) -> bool:
        try:
            stat = (self.folder / relative).stat()
        except FileNotFoundError:
            return False
        return state["files"].get(relative) == [stat.st_size, stat.st_mtime_ns]

    def local_files(self, run_id: str | None) -> dict[str, os.stat_result]:
        """The copy's synced files of ``run_id`` (its partitions in every table folder, commits, manifest and run
        folder, quarantine, stage records), or, for None, those of no run (models, sweeps, the layout file), by lake
        path: only those folders are walked, so a commit's cost does not grow with the other runs of the copy."""
        tops = sorted(p.name for p in self.folder.iterdir() if synced(p.name)) if self.folder.is_dir() else []
        if run_id is None:
            starts = [t for t in tops if not (self.folder / t).is_dir() or t in (layout.MODELS, layout.SWEEPS)]
        else:
            starts = [f"{t}/{layout.RUN_FOLDER_PREFIX}{run_id}" for t in tops if not t.startswith("_")]
            starts += [f"{layout.COMMITS}/{run_id}", f"{layout.RUNS}/{run_id}", f"{layout.STAGING}/{run_id}"]
            starts.append(f"{layout.QUARANTINE}/{layout.QUARANTINE_RUN_PREFIX}{run_id}")
        found = {}
        for start in starts:
            if (self.folder / start).is_file():
                found[start] = os.stat(self.folder / start)
            for folder, folders, files in os.walk(self.folder / start):
                base = Path(folder).relative_to(self.folder).as_posix()
                folders[:] = [f for f in folders if synced(f"{base}/{f}") or staging_walked(f"{base}/{f}")]
                for name in files:
                    relative = f"{base}/{name}"
                    if synced(relative) and run_of(relative) == run_id:
                        with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                            found[relative] = os.stat(self.folder / relative)
        return found

    # -- reading the bucket -----------------------------------------------------------------------------------------
    def changesets(
        self, listing: dict[str, Listed], run_id: str | None = None, vanished: list[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """The changesets in the bucket (of ``run_id``, when given), by token: the changeset (``run``,
        ``iteration``, ``put``: lake path -> size, ``delete``) and its fate: ``committed`` (its iteration's commit
        object names it: not yet applied) or ``superseded`` (that commit object names another). One the lake did
        not write (not of that shape, or naming files outside its run) is left out: never applied, never read. One
        listed but gone when read (applied meanwhile) is added to ``vanished``."""
        found = {}
        for relative in listing:
            parts = relative.split("/")
            if parts[0] != UPLOADS or len(parts) != 3 or not parts[2].endswith(".json"):
                continue
            if run_id is not None and parts[1] != run_id:
                continue
            read = self.store.read(relative)
            if read is None and vanished is not None:
                vanished.append(relative)
            changeset = checked_changeset(as_json(read[0]) if read else {}, parts[1], self.store.root.url)
            if changeset is None:
                continue
            token = parts[2][: -len(".json")]
            if changeset["rewrite"]:  # judged by its own commit object, which a writer taking the run may abort
                fate = self._rewrite_fate(parts[1], token)
                if fate is None and self.store.read(relative) is None:  # applied and dropped meanwhile
                    if vanished is not None:
                        vanished.append(relative)
                    continue
                changeset["committed"], changeset["superseded"] = fate == "committed", fate == "aborted"
                found[token] = changeset
                continue
            commit = self.store.read(
                f"{layout.COMMITS}/{parts[1]}/{layout.commit_marker_name(changeset['iteration'])}"
            )
            named = as_json(commit[0]).get(STORE_KEY) if commit is not None else None
            changeset["committed"] = isinstance(named, dict) and named.get("changeset") == token
            changeset["superseded"] = commit is not None and not changeset["committed"]
            found[token] = changeset
        return found

    def _rewrite_fate(self, run_id: str, token: str) -> str | None:
        """A rewrite's fate by its commit object: "committed" (created by its writer), "aborted" (created first by
        a writer that took the run: never applied) or None (not yet either)."""
        read = self.store.read(f"{UPLOADS}/{run_id}/{token}{REWRITE_COMMITTED}")
        if read is None:
            return None
        return "committed" if as_json(read[0]).get("rewrite") == token else "aborted"

    def pull(
        self,
        run_id: str | None = None,
        exact: bool = False,
        only: str | None = None,
        tables: frozenset[str] | None = None,
    ) -> int:
        """Download what the copy lacks or holds in an older version, and remove what the bucket deleted (of
        ``run_id`` only, when given; ``only="read"``: what the tables and the runs' manifests need; ``only="write"``:
        those and the models, the runs' checkpoints coming with :meth:`take_run`, each run's to its writer; with
        ``tables`` too, the row files of those tables alone: a query's, the others' left as they are). A file
        changed here and not pushed yet (a local writer's) is left alone, unless ``exact`` (a writer taking its run:
        the bucket's files win, and the copy's files of iterations the bucket committed that it does not hold go);
        the files of lake layout 1 are always the bucket's (:meth:`_old_layout_file`). Committed changesets not
        yet applied are read from their uploads. Returns how many files were downloaded; a file that vanished
        meanwhile (a changeset applied) makes it look again, once."""
        fetched, missed = self._pull(run_id, exact, only, tables)
        if missed:
            fetched += self._pull(run_id, exact, only, tables)[0]
        return fetched

    def _pull(
        self, run_id: str | None, exact: bool, only: str | None, tables: frozenset[str] | None = None
    ) -> tuple[int, bool]:
        with self._state() as state:  # the listing too: a local writer's push and this pull never interleave
            listing = {k: v for k, v in self.store.listing().items() if not folder_marker(k, v.size)}
            vanished: list[str] = []
            pending = [(t, c) for t, c in self.changesets(listing, run_id, vanished).items() if c["committed"]]
            wanted: dict[str, str] = {}  # the copy's file -> the object it comes from
            written: dict[str, bool] = {}
            for relative, listed in sorted(listing.items()):
                checked_relative(relative, self.store.root.url)
                if not synced(relative) or (run_id is not None and run_of(relative) != run_id):
                    continue
                if only is not None and not for_tables(relative, only == "write", tables):
                    continue
                held = state["objects"].get(relative) == listed.etag
                bucket_wins = exact or self._old_layout_file(relative, written)
                if held and (not bucket_wins or self._unchanged(state, relative)):
                    continue  # held (or changed or deleted here by a local writer that has not committed it yet)
                if not bucket_wins and relative in state["files"] and self._pending_here(state, relative):
                    continue
                wanted[relative] = relative
            for token, changeset in pending:  # a committed changeset's files: from its uploads, which win
                wanted_here = [r for r in changeset["put"] if only is None or for_tables(r, only == "write", tables)]
                for relative in wanted_here:
                    upload = f"{UPLOADS}/{changeset['run']}/{token}/{relative}"
                    if upload in listing and state["objects"].get(relative) != listing[upload].etag:
                        wanted[relative] = upload
            targets = sorted(wanted)
            tags = each(self._download, [(wanted[t], t) for t in targets])
            for relative, etag in zip(targets, tags, strict=True):
                if etag is not None:
                    self._stamp(state, relative, etag)
            self._remove_deleted(state, listing, pending, run_id, exact)
            if exact and run_id is not None:
                self._drop_stale_attempt(state, listing, pending, run_id)
        return sum(t is not None for t in tags), None in tags or bool(vanished)

    def _written_here(self, run_id: str) -> bool:
        """Whether a process of this host holds the run's writer lock in this copy (its ``flock``)."""
        try:
            path = layout.writer_lock_file(self.folder, run_id)
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, LakeError):  # no lock file, or a name no run of the lake has
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(descriptor)  # a shared lock taken here goes with the descriptor
        return False

    def _old_layout_file(self, relative: str, written: dict[str, bool]) -> bool:
        """Whether ``relative`` is a file of lake layout 1 that the bucket decides alone: its copy here comes back
        until the bucket deletes it (an upgrade interrupted after moving it here), unless this host's upgrade is
        moving its run now (it holds the run's writer lock). ``written`` caches the lock checks by run."""
        run = old_layout_run(relative)
        return run is not None and not written.setdefault(run, self._written_here(run))

    def _pending_here(self, state: dict[str, Any], relative: str) -> bool:
        """Whether the copy's file changed since it was pulled or pushed: a local writer's work not yet pushed."""
        return (self.folder / relative).exists() and not self._unchanged(state, relative)

    def _remove_deleted(self, state: dict[str, Any], listing: dict, pending: list, run_id: str | None, exact: bool):
        """Remove the copy's files whose objects the bucket deleted (or a committed changeset deletes), unless a
        local writer changed them since (``exact``: whatever)."""
        held = set(listing) | {r for _, c in pending for r in c["put"]}
        deleted = {r for _, c in pending for r in c["delete"]}
        written: dict[str, bool] = {}
        for relative in [r for r in state["objects"] if run_id is None or run_of(r) == run_id]:
            if relative in held and relative not in deleted:
                continue
            owner, bucket_wins = run_of(relative), exact or self._old_layout_file(relative, written)
            if not bucket_wins and (owner is None or written.setdefault(owner, self._written_here(owner))):
                continue  # a model, or a run a process of this host writes: its files stay under it
            if bucket_wins or not self._pending_here(state, relative):
                (self.folder / relative).unlink(missing_ok=True)
                self._forget(state, relative)
                if old_layout_run(relative) is not None:  # upgraded in the bucket: its emptied folders go
                    self._prune(Path(relative).parent, depth=2)

    def _prune(self, relative: Path, depth: int) -> None:
        """Remove the copy's folder ``relative`` and up to ``depth - 1`` of its parents, each only while empty."""
        for folder in [relative, *relative.parents][:depth]:
            try:
                (self.folder / folder).rmdir()
            except OSError:  # not empty (or gone): its parents are not either
                return

    def _drop_stale_attempt(self, state: dict[str, Any], listing: dict, pending: list, run_id: str) -> None:
        """A writer taking its run: the copy's row files (parts, their records) of iterations the bucket committed
        that the bucket does not hold go (a dead attempt's, here, of an iteration another host committed), and so
        do its stage records that the bucket does not hold, of an iteration the bucket committed or holds records
        of (the bucket's say which stages of it finished); those of a later iteration stay, reused by a resume here.
        A partition folder left empty goes too (an upgrade interrupted here redoes the partition)."""
        committed = {int(m.group(2)) for m in map(COMMIT_OBJECT.fullmatch, listing) if m and m.group(1) == run_id}
        held = set(listing) | {r for _, c in pending for r in c["put"]}
        recorded = {stage_record(r) for r in held if run_of(r) == run_id} - {None}
        for relative in self.local_files(run_id):
            record = stage_record(relative)
            stale = record is not None and (record <= max(committed, default=-1) or record in recorded)
            if (stale or rows_iteration(relative) in committed) and relative not in held:
                (self.folder / relative).unlink(missing_ok=True)
                self._forget(state, relative)
                if relative.count("/") == 3 and not relative.startswith("_"):  # a partition's: its folder, if empty
                    self._prune(Path(relative).parent, depth=1)

    def _download(self, pair: tuple[str, str]) -> str | None:
        """Download the object ``source`` to the copy's file ``relative``; its tag, or None when it is gone."""
        source, relative = pair
        target = self.folder / relative
        etag = self.store.download(source, target)
        if etag is not None and COMMIT_OBJECT.fullmatch(relative):  # the copy keeps the lake's payload alone
            payload = as_json(target.read_bytes())
            if STORE_KEY in payload:
                payload.pop(STORE_KEY)
                atomic_write_json(target, payload)
        return etag
