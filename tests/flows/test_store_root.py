"""A data root in an object store (issue 71), on a real S3-compatible server (tests.s3_env): the exact-resume run of
tests/flows/test_resume.py with ``--data-root s3://bucket/lake``, killed during the upload of an iteration and
again between its commit and the commit's application, each time resumed by another host (a local copy of its own),
ends bitwise like the run that never stopped on a local disk; a reader of a third host counts a committed but
unapplied iteration once; a local root uploaded to a bucket opens and resumes there; no credential reaches the
bucket, a local copy or any output."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_core.storage import DataLake
from ragen_core.storage.storecopy import UPLOADS
from tests.flows.test_resume import DISTRIBUTED, RUN, _overrides, _rows, _wait_then_reap
from tests.flows.test_vllm_runs import TABLES, same_as_whole
from tests.s3_env import KEY_ID, SECRET

pytestmark = pytest.mark.process


def _ragen(args, url, cache: Path, environment: dict, fault=None, api_url=None) -> tuple[int, str]:
    """The installed CLI on the data root ``url``, as a host whose local copies live in ``cache``."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED and not k.startswith("AWS_")}
    env.update(environment, RAGEN_OBJECT_CACHE=str(cache))
    if api_url:
        env["PREFECT_API_URL"] = api_url
    if fault:
        env["RAGEN_FAULT"] = fault
    cache.mkdir(parents=True, exist_ok=True)
    log = cache.parent / f"{cache.name}-{len(list(cache.parent.glob(cache.name + '-*.txt')))}.txt"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("ragen")), *args, "--data-root", url],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        _wait_then_reap(process, 400)
    return process.returncode, log.read_text()


def _keys(server, bucket: str) -> list[str]:
    return sorted(server.objects(bucket))


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory, s3_server, tiny_model_dir, tiny_policy, prefect_server, whole_bandit_run):
    """Train on the bucket from host A, killed mid upload of iteration 1; resumed from host B, killed once iteration
    2 is committed in the bucket but not applied (what a reader of host C sees then is kept); resumed from host A
    (whose copy holds what the first kill left) to the end."""
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: built here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    bucket = s3_server.bucket()
    url, env = f"s3://{bucket}/lake", s3_server.environment()
    hosts = tmp_path_factory.mktemp("hosts")
    api_url = prefect_server[0].api_url
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    state = {"outputs": []}
    rc, output = _ragen(train, url, hosts / "a", env, "store:mid_upload@1", api_url)
    state["outputs"].append(output)
    assert rc == -signal.SIGKILL, output[-3000:]
    state["after_upload_kill"] = _keys(s3_server, bucket)
    state["objects_after_upload_kill"] = s3_server.objects(bucket)
    rc, output = _ragen(["resume", RUN], url, hosts / "b", env, "store:committed@2", api_url)
    state["outputs"].append(output)
    assert rc == -signal.SIGKILL, output[-3000:]
    state["after_commit_kill"] = _keys(s3_server, bucket)
    state["objects_after_commit_kill"] = s3_server.objects(bucket)
    query = "SELECT iteration, split, count(*) AS n FROM trajectories GROUP BY ALL ORDER BY ALL"
    rc, output = _ragen(["sql", query, "--format", "csv"], url, hosts / "c", env)
    state["outputs"].append(output)
    state["reader"] = (rc, output)
    rc, output = _ragen(["resume", RUN], url, hosts / "a", env, None, api_url)
    state["outputs"].append(output)
    assert rc == 0, output[-3000:]
    state["end"] = _keys(s3_server, bucket)
    state["objects"] = s3_server.objects(bucket)
    return url, bucket, hosts, env, state, whole_bandit_run


def _committed(keys: list[str]) -> list[int]:
    prefix = f"lake/_commits/{RUN}/iteration="
    return sorted(int(k[len(prefix) : -len(".json")]) for k in keys if k.startswith(prefix))


def test_a_kill_during_the_upload_commits_nothing_of_the_iteration(killed_twice):
    _, _, _, _, state, _ = killed_twice
    keys = state["after_upload_kill"]
    assert _committed(keys) == [0]
    uploads = [k for k in keys if k.startswith(f"lake/{UPLOADS}/{RUN}/")]
    [changeset] = [k for k in uploads if k.count("/") == 3]  # written first, then half its files
    assert len(uploads) > 1 and json.loads(state["objects_after_upload_kill"][changeset])["iteration"] == 1
    assert not any(k.startswith(f"lake/trajectories/run-{RUN}/iteration-1/") for k in keys)


def test_a_kill_after_the_commit_leaves_it_pending_and_a_reader_counts_it_once(killed_twice):
    _, _, _, _, state, _ = killed_twice
    keys = state["after_commit_kill"]
    assert _committed(keys) == [0, 1, 2]
    changesets = {
        k: json.loads(data)
        for k, data in state["objects_after_commit_kill"].items()
        if k.startswith(f"lake/{UPLOADS}/{RUN}/") and k.count("/") == 3
    }
    # iteration 2's, committed, not applied; the first kill's of iteration 1 was deleted once host B's commit of 1
    # superseded it (before that commit it stayed: a changeset nobody superseded may still be committed)
    assert sorted(c["iteration"] for c in changesets.values()) == [2]
    assert not any(k.startswith(f"lake/trajectories/run-{RUN}/iteration-2/") for k in keys)
    rc, output = state["reader"]
    assert rc == 0, output
    rows = list(csv.reader(output.strip().splitlines()[1:]))
    counts = {(int(i), split): int(n) for i, split, n in rows}
    # 2 groups of 4 trained per iteration, 2 validation instances: iteration 2 read from its uploads, once
    assert counts == {(0, "train"): 8, (0, "val"): 2, (1, "train"): 8, (1, "val"): 2, (2, "train"): 8, (2, "val"): 2}


def test_the_resumed_run_ends_bitwise_like_the_whole_one_on_a_local_disk(killed_twice, monkeypatch):
    from ragen_core.storage.storecopy import open_store_root

    url, _, hosts, env, state, whole = killed_twice
    assert _committed(state["end"]) == [0, 1, 2, 3]
    assert not any(k.startswith(f"lake/{UPLOADS}/") for k in state["end"])  # every changeset applied and cleared
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAGEN_OBJECT_CACHE", str(hosts / "d"))
    root = open_store_root(url)  # a fourth host: everything from the bucket alone
    same_as_whole(whole, root)
    assert DataLake(root).committed_iterations(RUN) == [0, 1, 2, 3]
    assert len(DataLake(root).read_manifest(RUN).resumes) == 2


def test_no_credential_reaches_the_bucket_a_local_copy_or_an_output(killed_twice):
    _, _, hosts, _, state, _ = killed_twice
    secrets = (KEY_ID.encode(), SECRET.encode())
    assert not [k for k, data in state["objects"].items() if any(s in data for s in secrets)]
    leaked = []
    for path in hosts.rglob("*"):
        if path.is_file() and any(s in path.read_bytes() for s in secrets):
            leaked.append(path)
    assert not leaked  # the copies, their state files and every command's output
    assert all(KEY_ID not in o and SECRET not in o for o in state["outputs"])


def test_a_local_root_uploaded_to_a_bucket_opens_and_resumes_there(
    tmp_path, s3_server, tiny_model_dir, prefect_server, whole_bandit_run
):
    from tests.flows.test_resume import _ragen as ragen_local

    local = tmp_path / "local"
    local.mkdir()
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    rc, output = ragen_local(train, local, "update:inside@1", prefect_server[0].api_url)
    assert rc == -signal.SIGKILL, output[-3000:]
    bucket = s3_server.bucket()
    env = s3_server.environment()
    client = s3_server.client()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):  # what `aws s3 sync local s3://.../copied` does
        client.upload_file(str(path), bucket, f"copied/{path.relative_to(local).as_posix()}")
    url = f"s3://{bucket}/copied"
    rc, output = _ragen(["resume", RUN], url, tmp_path / "host", env, None, prefect_server[0].api_url)
    assert rc == 0 and "resumed at iteration 1" in output, output[-3000:]
    rc, output = _ragen(["runs", "--format", "csv"], url, tmp_path / "reader", env)
    assert rc == 0 and f'"{RUN}","train","completed"' in output, output
    copy = next((tmp_path / "host").glob("*/copied"))
    same_as_whole(whole_bandit_run, copy)
    assert set(TABLES) <= {p.name for p in copy.iterdir()}


def test_the_viewer_and_a_plot_show_the_run_from_the_bucket(killed_twice, monkeypatch):
    from tests.view.conftest import fetch, start_viewer

    url, _, hosts, env, _, _ = killed_twice
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAGEN_OBJECT_CACHE", str(hosts / "viewer"))
    viewer = start_viewer(url)
    try:
        status, body = fetch(viewer.opener(visit=False), viewer.url)
        assert status == 200 and f">{RUN}<" in body, body[:2000]
        status, body = fetch(viewer.opener(), f"{viewer.base}/runs/{RUN}/iterations/2")
        assert status == 200 and "bandit" in body, body[:2000]
    finally:
        viewer.process.send_signal(signal.SIGINT)
        viewer.process.wait(timeout=60)
    plotted = hosts / "plot.png"
    rc, output = _ragen(["plot", RUN, "--out", str(plotted)], url, hosts / "plotter", env)
    assert rc == 0 and plotted.stat().st_size > 10_000, output
    copy = next((hosts / "viewer").glob("*/lake"))
    assert not (copy / "runs" / RUN / "checkpoints").exists()  # a reader's copy holds the tables, no checkpoint


def _bucket_copy(s3_server, bucket: str, objects: dict) -> str:
    """The finished run, copied into a bucket of its own (so the module's other tests keep theirs as it was)."""
    copy = s3_server.bucket()
    client = s3_server.client()
    for key in objects:
        client.copy_object(Bucket=copy, Key=key, CopySource={"Bucket": bucket, "Key": key})
    return f"s3://{copy}/lake"


def test_a_completed_run_in_a_bucket_is_extended_from_another_host(killed_twice, s3_server, prefect_server, tmp_path):
    _, bucket, _, env, state, _ = killed_twice
    url = _bucket_copy(s3_server, bucket, state["objects"])
    copy = url.split("/")[2]
    extend = ["resume", RUN, "--force-config", "trainer.iterations", "trainer.iterations=4"]
    rc, output = _ragen(extend, url, tmp_path / "b", env, None, prefect_server[0].api_url)
    assert rc == 0, output[-3000:]
    keys = _keys(s3_server, copy)
    assert _committed(keys) == [0, 1, 2, 3, 4] and not any(k.startswith(f"lake/{UPLOADS}/") for k in keys)
    query = "SELECT iteration, split, count(*) AS n FROM trajectories GROUP BY ALL ORDER BY ALL"
    rc, output = _ragen(["sql", query, "--format", "csv"], url, tmp_path / "reader", env)
    counts = {(int(i), split): int(n) for i, split, n in csv.reader(output.strip().splitlines()[1:])}
    assert counts == {**{(i, "train"): 8 for i in range(4)}, **{(i, "val"): 2 for i in range(5)}}, output


def test_a_checkpoint_in_a_bucket_is_evaluated_exported_and_removed_from_other_hosts(
    killed_twice, s3_server, prefect_server, tmp_path
):
    _, bucket, _, env, state, _ = killed_twice
    url = _bucket_copy(s3_server, bucket, state["objects"])
    api_url = prefect_server[0].api_url
    evaluate = ["eval", f"{RUN}@2", "--n", "4", "--run-id", "ev"]
    rc, output = _ragen(evaluate, url, tmp_path / "evaluator", env, None, api_url)  # the checkpoint after 2 updates
    assert rc == 0, output[-3000:]
    assert _committed([k.replace("/ev/", f"/{RUN}/") for k in _keys(s3_server, url.split("/")[2]) if "/ev/" in k])
    query = "SELECT count(*) AS n FROM trajectories WHERE run_id = 'ev'"
    rc, output = _ragen(["sql", query, "--format", "csv"], url, tmp_path / "reader", env)
    assert rc == 0 and output.strip().splitlines()[-1] == "4", output  # its rows, read by a third host
    rc, output = _ragen(["export", RUN, "--out", str(tmp_path / "exported")], url, tmp_path / "exporter", env)
    assert rc == 0, output
    import pyarrow.parquet as pq

    folder = tmp_path / "exported"
    # three updates of 2 groups of 4, four validations of 2 instances (iterations 0 to 3)
    assert pq.read_table(folder / "train" / "part-00000.parquet").num_rows == 24
    assert pq.read_table(folder / "validation" / "part-00000.parquet").num_rows == 8
    assert (folder / "README.md").is_file()
    rc, output = _ragen(["runs", "rm", "ev", "--yes"], url, tmp_path / "remover", env)
    assert rc == 0 and "removed run ev" in output, output
    keys = _keys(s3_server, url.split("/")[2])
    assert not [k for k in keys if "/ev/" in k or "/run-ev/" in k or "run_id=ev/" in k], keys
    assert _committed(keys) == [0, 1, 2, 3]  # run r's objects stay
    rc, output = _ragen(["runs", "--format", "csv"], url, tmp_path / "reader", env)  # the reader's copy follows
    assert rc == 0 and '"ev"' not in output and f'"{RUN}"' in output, output


def test_a_run_in_a_bucket_is_re_trained_offline_from_another_host(killed_twice, s3_server, prefect_server, tmp_path):
    _, bucket, _, env, state, _ = killed_twice
    url = _bucket_copy(s3_server, bucket, state["objects"])
    # iteration 2's training rows, from the checkpoint after 2 updates (its own run's, read from the bucket)
    selected = f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND split = 'train' AND iteration = 2"
    tiny = _overrides(Path("unused"))[2:]  # the run's own sizes (its model comes from the checkpoint)
    retrain = ["retrain", "--from", selected, "--init", f"run:{RUN}@2", "--run-id", "rt", *tiny]
    rc, output = _ragen(retrain, url, tmp_path / "trainer", env, None, prefect_server[0].api_url)
    assert rc == 0 and "trained on 8 stored trajectories" in output, output[-3000:]
    keys = _keys(s3_server, url.split("/")[2])
    # one epoch (offline.epochs=1), committed as iteration 0, then the final validation as iteration 1
    assert _committed([k.replace("/rt/", f"/{RUN}/") for k in keys if k.startswith("lake/_commits/rt/")]) == [0, 1]
    assert not any(k.startswith(f"lake/{UPLOADS}/") for k in keys)
    query = "SELECT run_id, source_runs, init_run, init_iteration FROM runs WHERE run_id = 'rt'"
    rc, output = _ragen(["sql", query, "--format", "json"], url, tmp_path / "reader", env)
    assert rc == 0, output
    [row] = json.loads(output[output.index("[") :])
    assert (row["source_runs"], row["init_run"], row["init_iteration"]) == ([RUN], RUN, 2), row


def _parts(keys: list[str]) -> dict[str, int]:
    """The part objects of run r in each partition of the bucket's lake, by partition."""
    found: dict[str, int] = {}
    for key in keys:
        folder, _, name = key.rpartition("/")
        if f"/run-{RUN}/" in key and name.startswith("part-") and not key.startswith(f"lake/{UPLOADS}/"):
            found[folder] = found.get(folder, 0) + 1
    return found


def test_a_run_in_a_bucket_is_compacted_through_kills_and_read_the_same(
    killed_twice, s3_server, tmp_path, monkeypatch
):
    """`ragen runs compact` on a bucket: killed half-way through uploading its rewrite (the bucket as it was), then
    once the rewrite is committed but not applied (a reader counts every row once, from the uploads), then run again
    to the end: one part per partition, and every table's rows those of the run that never stopped."""
    from ragen_core.storage.storecopy import open_store_root

    _, bucket, _, env, state, whole = killed_twice
    url = _bucket_copy(s3_server, bucket, state["objects"])
    copy = url.split("/")[2]
    before = _parts(_keys(s3_server, copy))
    assert max(before.values()) > 1  # partitions of several parts to merge
    compact = ["runs", "compact", RUN]
    rc, output = _ragen(compact, url, tmp_path / "compactor", env, "store:mid_upload@3")
    assert rc == -signal.SIGKILL, output[-3000:]
    assert _parts(_keys(s3_server, copy)) == before  # nothing of the rewrite committed
    rc, output = _ragen(compact, url, tmp_path / "compactor", env, "store:rewritten")
    assert rc == -signal.SIGKILL, output[-3000:]
    assert _parts(_keys(s3_server, copy)) == before  # committed, not yet applied
    query = "SELECT iteration, split, count(*) AS n FROM trajectories GROUP BY ALL ORDER BY ALL"
    rc, output = _ragen(["sql", query, "--format", "csv"], url, tmp_path / "reader", env)
    counts = {(int(i), split): int(n) for i, split, n in csv.reader(output.strip().splitlines()[1:])}
    assert rc == 0 and counts == {**{(i, "train"): 8 for i in range(3)}, **{(i, "val"): 2 for i in range(4)}}, output
    rc, output = _ragen(compact, url, tmp_path / "compactor", env)
    assert rc == 0 and f"run {RUN}: merged 0 partition(s)" in output, output  # the committed rewrite was applied
    keys = _keys(s3_server, copy)
    assert set(_parts(keys)) == set(before) and set(_parts(keys).values()) == {1}
    assert not any(k.startswith(f"lake/{UPLOADS}/") for k in keys)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAGEN_OBJECT_CACHE", str(tmp_path / "fresh"))
    same_as_whole(whole, open_store_root(url))  # a host of its own: the rows, whole, once


def test_a_query_on_a_bucket_downloads_the_rows_of_the_tables_it_names_alone(killed_twice, tmp_path):
    """`ragen sql` on a bucket: the reader's copy gets the rows of the tables the query names (every run's manifest
    and commits still); the next query of another table gets that one's; a name the parse tree cannot show (a table
    function) gets every table's."""
    url, bucket, _, env, _, whole = killed_twice
    copy = tmp_path / "reader" / bucket / "lake"

    def parquet_tables() -> set[str]:
        return {p.relative_to(copy).parts[0] for p in copy.rglob("*.parquet")}

    def sql(text: str) -> str:
        rc, output = _ragen(["sql", text, "--format", "csv"], url, tmp_path / "reader", env)
        assert rc == 0, output
        return output.strip().splitlines()[-1]

    expected = {t: len(_rows(whole, t)) for t in ("metrics", "trajectories")}
    kept = "SELECT count(*) AS n FROM metrics WHERE NOT starts_with(name, 'time/') AND NOT starts_with(name, 'perf/')"
    assert sql(kept) == str(expected["metrics"])  # tests.flows.test_resume._rows's rows: no clock's
    assert parquet_tables() == {"metrics"} and (copy / "runs" / RUN / "manifest.json").is_file()
    assert sql("SELECT count(*) AS n FROM trajectories") == str(expected["trajectories"])
    assert parquet_tables() == {"metrics", "trajectories"}
    assert sql("SELECT count(*) AS n FROM duckdb_views() WHERE NOT internal") != "0"  # every table's rows then
    assert {"turns", "evaluations"} <= parquet_tables()
