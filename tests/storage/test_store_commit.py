"""Commits to a data root in an object store (issue 71) on a real S3-compatible server: two writers racing to commit
the same iteration, each from a local copy of its own, end with one commit and the other writer stopped in one
line, every row counted once; a writer whose lease another host took over is refused before it uploads anything;
a reader never counts an upload no commit names."""

from __future__ import annotations

import threading
import time

import pytest

from ragen_core.storage import DataLake
from ragen_core.storage.files import LakeError
from ragen_core.storage.lease import LeaseLostError
from ragen_core.storage.locks import acquire, release
from ragen_core.storage.storecopy import UPLOADS, open_store_root, store_copy

RUN = "r"


def _open(url: str, cache, monkeypatch) -> DataLake:
    """The data root as a host whose local copies live in ``cache`` sees it."""
    monkeypatch.setenv("RAGEN_OBJECT_CACHE", str(cache))
    return DataLake(open_store_root(url))


def _metrics(value: float) -> list[dict]:
    return [{"run_id": RUN, "iteration": 0, "name": "loss", "value": value}]


def test_two_writers_racing_to_commit_one_iteration_one_wins_and_rows_count_once(s3_root, tmp_path, monkeypatch):
    url, server = s3_root
    lakes = [_open(url, tmp_path / f"host{n}", monkeypatch) for n in range(2)]
    for number, lake in enumerate(lakes):  # each writes its own rows of iteration 0, under the same part name
        lake.write_rows("metrics", RUN, 0, _metrics(float(number)), stage="commit")
    start, outcomes = threading.Barrier(2), {}

    def commit(number: int) -> None:
        start.wait()
        try:
            lakes[number].commit_iteration(RUN, 0, {"by": number})
            outcomes[number] = "won"
        except LakeError as exc:
            outcomes[number] = str(exc)

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [winner] = [n for n, outcome in outcomes.items() if outcome == "won"]
    loser = 1 - winner
    assert outcomes[loser] == (
        f"iteration 0 of run {RUN!r} was committed in {url} by another writer: this one stops and counts nothing "
        "of it (`ragen resume` goes on from the bucket)"
    )
    assert lakes[loser].committed_iterations(RUN) == []  # the loser's copy records no commit
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert reader.committed_iterations(RUN) == [0]
    assert reader.commit_payload(RUN, 0) == {"by": winner}
    assert reader.read_table("metrics", RUN).to_pylist() == _metrics(float(winner))  # the winner's row, once
    assert not [k for k in server.objects(url.split("/")[2]) if f"/{UPLOADS}/" in f"/{k}"]  # the loser's cleared


def test_a_writer_whose_lease_was_taken_over_uploads_nothing(s3_root, tmp_path, monkeypatch):
    url, server = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "2")
    first = _open(url, tmp_path / "first", monkeypatch)
    lock = acquire(first.root, RUN, command=["first"])
    lock.store_lease.stop.set()  # the first writer stalls (a suspended job): its lease goes unrenewed
    first.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit", publish=False)
    time.sleep(2.5)
    second = _open(url, tmp_path / "second", monkeypatch)
    other = acquire(second.root, RUN, command=["second"])
    assert other.taken_over is not None and other.taken_over["command"] == "first"
    with pytest.raises(LeaseLostError, match=f"no longer holds the writer lease of run {RUN!r} in {url}"):
        first.publish(RUN, 0, "commit")  # fenced before anything reaches the bucket
    with pytest.raises(LeaseLostError):
        first.commit_iteration(RUN, 0, {"by": "first"})
    second.write_rows("metrics", RUN, 0, _metrics(2.0), stage="commit")
    second.commit_iteration(RUN, 0, {"by": "second"})
    release(other)
    release(lock)  # the stalled writer lets go: it never deletes the new holder's lease (already released here)
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert reader.read_table("metrics", RUN).to_pylist() == _metrics(2.0)
    assert not [k for k in server.objects(url.split("/")[2]) if UPLOADS in k]


def test_uploads_no_commit_names_are_never_read_and_the_next_writer_drops_them(s3_root, tmp_path, monkeypatch):
    url, server = s3_root
    writer = _open(url, tmp_path / "writer", monkeypatch)
    writer.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit")
    copy = store_copy(writer.root)
    part = next(p for p in copy.local_files(RUN) if p.startswith("metrics/"))
    copy.store.upload(writer.root / part, f"{UPLOADS}/{RUN}/deadbeef/{part}")  # a writer died mid upload
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert reader.read_table("metrics", RUN).num_rows == 0 and reader.committed_iterations(RUN) == []
    lock = acquire(writer.root, RUN)  # the next writer of the run
    release(lock)
    assert not [k for k in server.objects(url.split("/")[2]) if UPLOADS in k]


def test_an_object_named_to_escape_the_copy_is_refused_and_a_planted_changeset_ignored(s3_root, tmp_path, monkeypatch):
    url, server = s3_root
    bucket = url.split("/")[2]
    client = server.client()
    client.put_object(Bucket=bucket, Key=f"lake/{UPLOADS}/{RUN}/junk.json", Body=b"{not json")  # never applied
    client.put_object(Bucket=bucket, Key=f"lake/{UPLOADS}/{RUN}/list.json", Body=b"[1, 2]")
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert reader.committed_iterations(RUN) == []
    client.put_object(Bucket=bucket, Key="lake/runs/../../escaped.txt", Body=b"x")
    with pytest.raises(LakeError, match=r"the object 'runs/\.\./\.\./escaped\.txt' under s3://.* cannot name a file"):
        _open(url, tmp_path / "second", monkeypatch)
    assert not list(tmp_path.rglob("escaped.txt"))


def test_a_paused_writers_changeset_survives_a_take_over_and_its_late_commit_is_whole(s3_root, tmp_path, monkeypatch):
    """Writer A's lease expires while it is about to commit; B takes the run over. B must not delete A's changeset
    (nobody committed its iteration): A's commit, once it goes through, holds every row; B's then stops."""
    url, _ = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "2")
    first = _open(url, tmp_path / "first", monkeypatch)
    lock = acquire(first.root, RUN, command=["first"])
    first.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit")
    copy = store_copy(first.root)
    at_commit, go_on = threading.Event(), threading.Event()
    create = copy.store.create

    def paused_create(relative, data):
        if relative.startswith("_commits/"):
            lock.store_lease.stop.set()  # paused past its lease, after its last check
            at_commit.set()
            go_on.wait(60)
        return create(relative, data)

    monkeypatch.setattr(copy.store, "create", paused_create)
    outcome = {}
    writer = threading.Thread(target=lambda: outcome.setdefault("a", first.commit_iteration(RUN, 0, {"by": "a"})))
    writer.start()
    assert at_commit.wait(60)
    time.sleep(2.5)
    second = _open(url, tmp_path / "second", monkeypatch)
    other = acquire(second.root, RUN, command=["second"])  # takes the expired lease over
    go_on.set()
    writer.join(60)
    assert "a" in outcome  # A's commit went through: its changeset was kept
    second.write_rows("metrics", RUN, 0, _metrics(2.0), stage="commit")
    with pytest.raises(LakeError, match="was committed in .* by another writer"):
        second.commit_iteration(RUN, 0, {"by": "b"})
    release(other)
    release(lock)
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert reader.commit_payload(RUN, 0) == {"by": "a"}
    assert reader.read_table("metrics", RUN).to_pylist() == _metrics(1.0)  # A's row, whole, once


def test_a_conditional_put_whose_answer_was_lost_is_known_as_its_own(s3_root):
    from ragen_core.storage.objectstore import Store, parse_root

    store = Store(parse_root(s3_root[0]))
    first = store.create("x.json", b'{"token": "mine"}')
    # the retry of a put that succeeded meets its own object: the same bytes, so it is this put's, not another's
    assert store.create("x.json", b'{"token": "mine"}') == first
    assert store.create("x.json", b'{"token": "theirs"}') is None
    assert store.replace("x.json", b'{"token": "mine"}', '"stale"') == first


def test_a_reader_copy_follows_what_the_bucket_withdrew_and_ignores_folder_markers(s3_root, tmp_path, monkeypatch):
    url, server = s3_root
    bucket = url.split("/")[2]
    writer = _open(url, tmp_path / "writer", monkeypatch)
    writer.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit")
    writer.commit_iteration(RUN, 0, {})
    assert _open(url, tmp_path / "reader", monkeypatch).committed_iterations(RUN) == [0]
    writer.withdraw_commit(RUN, 0)  # a run extended past its final validation reopens it
    server.client().put_object(Bucket=bucket, Key="lake/models/", Body=b"")  # a console's folder marker
    assert _open(url, tmp_path / "reader", monkeypatch).committed_iterations(RUN) == []


def test_objects_that_clash_with_folders_or_name_another_runs_files_are_refused_or_ignored(
    s3_root, tmp_path, monkeypatch
):
    url, server = s3_root
    bucket = url.split("/")[2]
    client = server.client()
    other = f"lake/{UPLOADS}/{RUN}/planted.json"  # a changeset of run r naming run s's manifest: never applied
    client.put_object(Bucket=bucket, Key=other, Body=b'{"iteration": 0, "put": {"runs/s/manifest.json": 1}}')
    client.put_object(
        Bucket=bucket, Key="lake/_commits/r/iteration=0.json", Body=b'{"_object_store": {"changeset": "planted"}}'
    )
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert not (reader.root / "runs" / "s").exists()
    client.put_object(Bucket=bucket, Key="lake/runs/s/manifest.json", Body=b"{}")
    client.put_object(Bucket=bucket, Key="lake/runs/s/manifest.json/x", Body=b"{}")  # a file and a folder at once
    with pytest.raises(LakeError, match=r"cannot write s3://.*/runs/s/manifest\.json(/x)? to .*: "):
        _open(url, tmp_path / "second", monkeypatch)


def test_a_store_that_ignores_conditional_writes_is_refused_before_a_run_is_taken(s3_root, tmp_path, monkeypatch):
    import ragen_core.storage.storenames as storenames

    url, _ = s3_root
    lake = _open(url, tmp_path / "host", monkeypatch)
    copy = store_copy(lake.root)
    monkeypatch.setattr(storenames, "_probed", set())
    monkeypatch.setattr(copy.store, "create", lambda relative, data: copy.store.write(relative, data))  # no condition
    with pytest.raises(LakeError, match=r"ignores conditional writes \(If-None-Match, If-Match\), on which a"):
        acquire(lake.root, RUN)
    assert store_copy(lake.root).store.listing("runs/") == {}  # no lease object was claimed


def test_a_pull_beside_a_local_writer_keeps_its_files_and_its_deletions(s3_root, tmp_path, monkeypatch):
    """One copy shared by a writer and a reader of this host: the reader's pull neither brings back a file the
    writer deleted and has not committed the deletion of (a pruned checkpoint), nor removes a file of the run the
    writer holds that the bucket lost meanwhile; the writer's next commit deletes it in the bucket."""
    url, server = s3_root
    bucket = url.split("/")[2]
    lake = _open(url, tmp_path / "host", monkeypatch)
    lock = acquire(lake.root, RUN)
    pruned, kept = lake.root / "runs" / RUN / "pruned.bin", lake.root / "runs" / RUN / "kept.bin"
    pruned.write_bytes(b"p")
    kept.write_bytes(b"k")
    lake.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit")
    lake.commit_iteration(RUN, 0, {})
    pruned.unlink()  # the writer prunes it; the deletion goes with its next commit
    server.client().delete_object(Bucket=bucket, Key=f"lake/runs/{RUN}/kept.bin")
    assert _open(url, tmp_path / "host", monkeypatch).root == lake.root  # a reader of this host, same copy
    assert not pruned.exists() and kept.exists()
    lake.write_rows("metrics", RUN, 1, [{**_metrics(2.0)[0], "iteration": 1}], stage="commit")
    lake.commit_iteration(RUN, 1, {})
    assert f"lake/runs/{RUN}/pruned.bin" not in server.objects(bucket)
    release(lock)


def test_a_commit_this_copy_made_and_another_host_withdrew_is_gone_from_it(s3_root, tmp_path, monkeypatch):
    url, _ = s3_root
    first = _open(url, tmp_path / "first", monkeypatch)
    first.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit")
    first.commit_iteration(RUN, 0, {})
    second = _open(url, tmp_path / "second", monkeypatch)
    second.withdraw_commit(RUN, 0)
    assert _open(url, tmp_path / "first", monkeypatch).committed_iterations(RUN) == []


def test_a_renewal_whose_answer_was_lost_keeps_the_lease(s3_root, monkeypatch):
    import os

    from ragen_core.storage.objectstore import Store, StoreError, parse_root
    from ragen_core.storage.storelease import claim_store_lease

    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "60")
    store = Store(parse_root(s3_root[0]))
    lease, _ = claim_store_lease(store, {"run_id": RUN, "pid": os.getpid(), "host": "h"}, LakeError)
    lease.stop.set()
    replace, calls = store.replace, []

    def lost_answer(relative, data, etag):
        calls.append(relative)
        tag = replace(relative, data, etag)
        if len(calls) == 1:
            raise StoreError("read timeout")  # the put landed; its answer did not
        return tag

    monkeypatch.setattr(store, "replace", lost_answer)
    with lease.guard:
        lease._renew()  # lands, answer lost
        lease._renew()  # its If-Match fails on our own renewal: read back, known by its token
    assert lease.lost is None
    lease.check()
    lease.release()


def test_a_rewrite_paused_past_its_lease_is_aborted_by_the_writer_that_takes_the_run(s3_root, tmp_path, monkeypatch):
    """A compaction (`ragen runs compact`) whose lease expires just before it commits its rewrite, while another
    host takes the run: the taker aborts the rewrite (its commit object created first, as aborted) and deletes its
    uploads; the compaction then stops in one line, and a reader reads the run as it was, every row once."""
    from ragen_core.storage.maintenance import compact_run

    url, server = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "2")
    first = _open(url, tmp_path / "first", monkeypatch)
    lock = acquire(first.root, RUN, command=["first"])
    rows = [*_metrics(1.0), {"run_id": RUN, "iteration": 0, "name": "kl", "value": 0.5}]
    first.write_rows("metrics", RUN, 0, rows[:1], stage="commit")
    first.write_rows("metrics", RUN, 0, rows[1:], stage="update")  # two parts: a partition to merge
    first.commit_iteration(RUN, 0, {"by": "first"})
    release(lock)
    copy = store_copy(first.root)
    at_commit, go_on, outcome = threading.Event(), threading.Event(), {}
    create = copy.store.create

    def paused_create(relative, data):
        if relative.endswith(".committed"):
            copy.leases[RUN].stop.set()  # paused past its lease, after its last check
            at_commit.set()
            go_on.wait(60)
        return create(relative, data)

    def compact() -> None:
        try:
            compact_run(first, RUN)
        except LakeError as exc:
            outcome["error"] = str(exc)

    monkeypatch.setattr(copy.store, "create", paused_create)
    compactor = threading.Thread(target=compact)
    compactor.start()
    assert at_commit.wait(60)
    time.sleep(2.5)
    second = _open(url, tmp_path / "second", monkeypatch)
    other = acquire(second.root, RUN, command=["second"])  # takes the expired lease over, aborts the rewrite
    go_on.set()
    compactor.join(60)
    assert outcome["error"] == (
        f"another writer took run {RUN!r} in {url} while this command rewrote its files: the rewrite was "
        "withdrawn, nothing of it counts; run the command again"
    )
    release(other)
    keys = server.objects(url.split("/")[2])
    assert not [k for k in keys if f"/{UPLOADS}/" in f"/{k}"]  # the aborted rewrite's uploads and objects gone
    assert len([k for k in keys if k.startswith(f"lake/metrics/run-{RUN}/") and "/part-" in k]) == 2  # unmerged
    reader = _open(url, tmp_path / "reader", monkeypatch)
    assert sorted(reader.read_table("metrics", RUN).to_pylist(), key=lambda r: r["name"]) == sorted(
        rows, key=lambda r: r["name"]
    )


def test_a_rewrite_changes_only_row_files_of_committed_iterations():
    from ragen_core.storage.storenames import checked_changeset, stage_record

    url = "s3://b/lake"
    rows = f"metrics/run-{RUN}/iteration-0/part-x.parquet"
    for name, kept in [
        (rows, True),
        (f"runs/{RUN}/manifest.json", False),
        (f"_commits/{RUN}/iteration=0.json", False),
    ]:
        changeset = {"iteration": 0, "put": {name: 1}, "delete": [], "rewrite": True}
        assert (checked_changeset(changeset, RUN, url) is not None) is kept, name
    # a stage record's iteration is ASCII digits; a trashed stage's record is none
    assert stage_record(f"_staging/{RUN}/12/generate/_DONE.json") == 12
    assert stage_record(f"_staging/{RUN}/\u00b2/generate/_DONE.json") is None
    assert stage_record(f"_staging/{RUN}/1/.old-generate/_DONE.json") is None


def test_a_writer_taking_its_run_keeps_its_own_later_stages_and_drops_those_another_host_settled(
    s3_root, tmp_path, monkeypatch
):
    """Stage records (a stage finished, its rows published, its iteration not committed) stay in the copy of the
    host that made them when it takes its run again, so a resume there reuses the stage; once another host has
    committed that iteration, they go (the bucket's files of it win)."""
    url, _ = s3_root
    first = _open(url, tmp_path / "first", monkeypatch)
    lock = acquire(first.root, RUN, command=["first"])
    first.write_rows("metrics", RUN, 0, _metrics(1.0), stage="commit")
    first.commit_iteration(RUN, 0, {"by": "first"})
    later = [{"run_id": RUN, "iteration": 1, "name": "loss", "value": 3.0}]
    first.write_rows("metrics", RUN, 1, later, stage="generate")
    first.mark_stage_done(RUN, 1, "generate", {"rows": 1})
    release(lock)  # the writer stops before committing iteration 1
    lock = acquire(first.root, RUN, command=["first again"])  # the same host takes its run again
    assert first.finished_stages(RUN, 1) == ["generate"]
    release(lock)
    second = _open(url, tmp_path / "second", monkeypatch)
    other = acquire(second.root, RUN, command=["second"])
    second.write_rows("metrics", RUN, 1, later, stage="update")
    second.commit_iteration(RUN, 1, {"by": "second"})
    release(other)
    lock = acquire(first.root, RUN, command=["first, third time"])
    assert first.finished_stages(RUN, 1) == []  # iteration 1 is the bucket's now
    assert first.read_table("metrics", RUN).to_pylist() == [*_metrics(1.0), *later]
    release(lock)


def test_only_the_files_of_layout_1_partitions_are_the_buckets_alone():
    from ragen_core.storage.storenames import old_layout_run, synced

    assert old_layout_run(f"metrics/run_id={RUN}/iteration=3/part-commit-00000.parquet") == RUN
    assert old_layout_run(f"metrics/run_id={RUN}/iteration=3/_COMPACTION.json") == RUN
    for other in (
        f"quarantine/run_id={RUN}/iteration=3/rollout/report.json",  # the quarantine's own run_id= folders
        f"metrics/run_id={RUN}/notes.txt",  # no partition's
        f"metrics/run-{RUN}/iteration-3/part-x.parquet",  # layout 2
        f"_commits/{RUN}/iteration=3.json",
    ):
        assert old_layout_run(other) is None, other
    # a partition an interrupted upgrade was filling never travels
    assert not synced(f"metrics/run-{RUN}/.upgrading-iteration-3/part-x.parquet")


def test_a_pull_gives_back_a_layout_1_file_unless_this_hosts_upgrade_holds_its_run(s3_root, tmp_path, monkeypatch):
    """A copy's layout-1 file is the bucket's: a pull brings back one the copy lost, and drops one the bucket
    deleted (its emptied folders too), but not while a process of this host holds the run's writer lock (an upgrade
    moving it)."""
    url, server = s3_root
    bucket, key = url.split("/")[2], f"metrics/run_id={RUN}/iteration=0/part-commit-00000.parquet"
    server.client().put_object(Bucket=bucket, Key=f"lake/{key}", Body=b"rows")
    lake = _open(url, tmp_path / "host", monkeypatch)
    old = lake.root / key
    assert old.read_bytes() == b"rows"
    lock = acquire(lake.root, RUN)
    old.unlink()  # moved by this host's upgrade, which holds the run
    _open(url, tmp_path / "host", monkeypatch)
    assert not old.exists()
    release(lock)
    _open(url, tmp_path / "host", monkeypatch)
    assert old.read_bytes() == b"rows"  # an interrupted upgrade's move, undone until the bucket drops the file
    server.client().delete_object(Bucket=bucket, Key=f"lake/{key}")
    _open(url, tmp_path / "host", monkeypatch)
    assert not old.exists() and not (lake.root / "metrics" / f"run_id={RUN}").exists()
    assert (lake.root / "metrics").is_dir()
