"""The object-store operations and the lease object (issue 71) against a real S3-compatible server (tests.s3_env):
the data root URL's rules, create-only and compare-and-swap puts, the lease object claimed by one of several
claimants, a live holder refusing the next, a stale one taken over by exactly one taker, a holder whose lease was
taken over fenced off; no credential in any error."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from ragen_core.storage.files import LakeError
from ragen_core.storage.lease import LeaseLostError
from ragen_core.storage.objectstore import Store, StoreError, StoreRoot, parse_root, redacted
from ragen_core.storage.storelease import claim_store_lease, lease_key, store_stale
from tests.s3_env import KEY_ID, SECRET


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://lake", "lake", ""),
        ("s3://lake/", "lake", ""),
        ("s3://my.lake-1/a/b=c", "my.lake-1", "a/b=c"),
        ("s3:/lake/runs", "lake", "runs"),
    ],  # the last: what pathlib makes of s3://lake/runs
)
def test_a_data_root_url_gives_its_bucket_and_prefix(url, bucket, prefix):
    assert parse_root(url) == StoreRoot(bucket, prefix)


@pytest.mark.parametrize(
    "url",
    [
        "s3://Lake/x",
        "s3://a/x",
        "s3://lake/../x",
        "s3://lake/a//b",
        "s3://key:secret@lake/x",
        "s3://lake/x?y=1",
        "s3://lake/a b",
        "s3://lake/.hidden",
    ],
)
def test_a_bad_data_root_url_is_refused_saying_how_to_write_it(url):
    with pytest.raises(StoreError, match="s3://BUCKET/PREFIX"):
        parse_root(url)


def test_keys_lie_under_the_prefix():
    root = StoreRoot("lake", "team/exp1")
    assert root.key("runs/r/manifest.json") == "team/exp1/runs/r/manifest.json"
    assert root.relative("team/exp1/runs/r/manifest.json") == "runs/r/manifest.json"
    assert StoreRoot("lake", "").key("x") == "x"


def test_create_only_and_compare_and_swap(s3_root):
    url, _ = s3_root
    store = Store(parse_root(url))
    first = store.create("a.json", b"1")
    assert first is not None
    assert store.create("a.json", b"2") is None  # exists: the second creator loses
    assert store.read("a.json") == (b"1", first)
    second = store.replace("a.json", b"3", first)
    assert second is not None and second != first
    assert store.replace("a.json", b"4", first) is None  # a stale tag
    assert store.read("a.json")[0] == b"3"
    assert store.remove("a.json", first) is False and store.remove("a.json", second) is True
    assert store.read("a.json") is None
    store.write("f/x", b"xx")
    store.write("f/y", b"y")
    listed = store.listing("f/")
    assert {k: v.size for k, v in listed.items()} == {"f/x": 2, "f/y": 1}


def test_a_missing_bucket_and_missing_credentials_are_one_line(s3_root, monkeypatch):
    url, _ = s3_root
    with pytest.raises(StoreError, match="does not exist") as missing:
        Store(parse_root("s3://no-such-bucket-here/x")).check_bucket()
    assert "\n" not in str(missing.value)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StoreError, match="no credentials for the object store of s3://.*set AWS_ACCESS_KEY_ID"):
        Store(parse_root(url)).write("x", b"1")


def test_redacted_hides_every_credential_in_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-abcdef")
    text = redacted(f"failed for {KEY_ID} with {SECRET} and session-token-abcdef\nsecond line")
    assert text == "failed for *** with *** and *** second line"


def _holder(run: str, pid: int, host: str = "h") -> dict:
    return {"run_id": run, "pid": pid, "host": host, "command": "test"}


def _refuse(record):
    return LakeError(f"held by {record.get('host')}")


def test_a_live_lease_refuses_the_next_claimant_and_is_released(s3_root, monkeypatch):
    url, _ = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "30")
    store = Store(parse_root(url))
    lease, taken = claim_store_lease(store, _holder("r", os.getpid(), "first"), _refuse)
    assert taken is None
    with pytest.raises(LakeError, match="held by first"):
        claim_store_lease(store, _holder("r", os.getpid(), "second"), _refuse)
    lease.check()  # still ours
    lease.release()
    assert store.read(lease_key("r")) is None
    again, _ = claim_store_lease(store, _holder("r", os.getpid(), "second"), _refuse)
    again.release()


def _plant(store: Store, run: str, renewed_ago: float, seconds: float = 2.0) -> str:
    record = {
        "run_id": run,
        "pid": 999999,
        "host": "gone",
        "machine": "another-machine",
        "token": "t",
        "renewed_at": time.time() - renewed_ago,
        "seconds": seconds,
    }
    return store.write(lease_key(run), json.dumps(record).encode())


def test_an_expired_lease_is_taken_over_by_exactly_one_of_six_takers(s3_root, monkeypatch):
    url, _ = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "30")
    store = Store(parse_root(url))
    _plant(store, "r", renewed_ago=5.0)  # expired: 5 s without renewal of a 2 s lease
    won, lost = [], []
    start = threading.Barrier(6)

    def take(number: int) -> None:
        start.wait()
        try:
            # live takers (this process): a record of this machine whose process is gone is stale at once
            lease, taken = claim_store_lease(store, _holder("r", os.getpid(), f"taker{number}"), _refuse)
            won.append((lease, taken))
        except LakeError as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=take, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(lost) == 5
    lease, taken = won[0]
    assert taken["host"] == "gone"  # the record it took over
    assert all(message.startswith(f"held by {lease.record['host']}") for message in lost)
    lease.release()


def test_a_lease_still_renewed_is_not_taken(s3_root):
    url, _ = s3_root
    store = Store(parse_root(url))
    _plant(store, "r", renewed_ago=0.5)
    with pytest.raises(LakeError, match="held by gone"):
        claim_store_lease(store, _holder("r", os.getpid()), _refuse)
    assert store_stale({"renewed_at": time.time() - 3, "seconds": 2.0, "machine": "x", "pid": 1})
    assert not store_stale({"renewed_at": time.time(), "seconds": 2.0, "machine": "x", "pid": 1})


def test_a_holder_whose_lease_was_taken_over_is_fenced(s3_root, monkeypatch):
    url, _ = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "2")
    store = Store(parse_root(url))
    lease, _ = claim_store_lease(store, _holder("r", os.getpid(), "slow"), _refuse)
    lease.stop.set()  # a holder stopped (a suspended job): it renews no more
    time.sleep(2.5)
    other, taken = claim_store_lease(store, _holder("r", os.getpid(), "new"), _refuse)
    assert taken["host"] == "slow"
    with pytest.raises(
        LeaseLostError, match=r"no longer holds the writer lease of run 'r'.*taken over by pid \d+ on host new"
    ):
        lease.check()
    lease.release()  # never deletes the new holder's lease
    other.check()
    other.release()


def test_renewals_keep_a_lease_past_its_length(s3_root, monkeypatch):
    url, _ = s3_root
    monkeypatch.setenv("RAGEN_LOCK_LEASE_S", "1.2")
    store = Store(parse_root(url))
    lease, _ = claim_store_lease(store, _holder("r", os.getpid()), _refuse)
    time.sleep(3)  # 2.5 lengths: renewed every 0.2 s meanwhile
    with pytest.raises(LakeError):
        claim_store_lease(store, _holder("r", os.getpid(), "other"), _refuse)
    lease.check()
    lease.release()


def test_a_large_file_goes_up_and_is_copied_in_parts(s3_root, tmp_path, monkeypatch):
    import ragen_core.storage.objectstore as objectstore

    url, _ = s3_root
    monkeypatch.setattr(objectstore, "SINGLE_PUT_BYTES", 1 << 20)
    monkeypatch.setattr(objectstore, "SINGLE_COPY_BYTES", 1 << 20)
    data = os.urandom(9 << 20)  # over boto3's multipart threshold (8 MiB): uploaded and copied in parts
    (tmp_path / "shard.pt").write_bytes(data)
    store = Store(parse_root(url))
    uploaded = store.upload(tmp_path / "shard.pt", "runs/r/checkpoints/shard.pt")
    assert uploaded.endswith('-2"')  # a multipart object's tag: <md5 of the parts' md5s>-<parts>
    copied = store.copy("runs/r/checkpoints/shard.pt", "runs/r/copy.pt", len(data))
    assert store.download("runs/r/copy.pt", tmp_path / "back.pt") == copied
    assert (tmp_path / "back.pt").read_bytes() == data
