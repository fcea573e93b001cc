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
