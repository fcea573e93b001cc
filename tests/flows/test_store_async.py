"""An async run (``trainer.max_staleness=2``, tests/flows/test_async.py's) with its data root in a bucket (issue 71):
killed on host A after a hand-off (a batch sampled ahead published, its iteration not committed), resumed on host B
(a local copy of its own) and killed in a commit's checkpoint, resumed on host A to its end: the final weights and
every table's rows equal those of the async run that never stopped on a local disk. A batch sampled ahead lives in
the copy that sampled it until the commit that waited for it uploads it with its own files; the host that resumes
finds it in the bucket, or samples it again with the same policy."""

from __future__ import annotations

import signal

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake
from tests.flows.test_async import ITERATIONS, RUN, _api_url, _train, whole  # noqa: F401 (the fixture)
from tests.flows.test_resume import _rows
from tests.flows.test_store_root import _committed, _keys
from tests.flows.test_store_root import _ragen as _on_host
from tests.flows.test_vllm_runs import TABLES

pytestmark = pytest.mark.process

KILLS = [("a", "handoff:after@1"), ("b", "checkpoint:mid_save@4")]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, s3_server, tiny_model_dir, tiny_policy, prefect_harness):
    """The async run on a bucket, killed at each of KILLS (each host its own copy) and resumed on host A to its end;
    a fourth host's copy of everything, the bucket's keys after each kill and at the end."""
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: built here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    bucket = s3_server.bucket()
    url, env = f"s3://{bucket}/lake", s3_server.environment()
    hosts, kept = tmp_path_factory.mktemp("async-hosts"), []
    for attempt, (host, fault) in enumerate(KILLS):
        args = _train(tiny_model_dir) if attempt == 0 else ["resume", RUN]
        rc, output = _on_host(args, url, hosts / host, env, fault, _api_url())
        assert rc == -signal.SIGKILL, f"{fault}: exit {rc}\n{output[-3000:]}"
        kept.append(_keys(s3_server, bucket))
    rc, output = _on_host(["resume", RUN], url, hosts / "a", env, None, _api_url())
    assert rc == 0, output[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**env, "RAGEN_OBJECT_CACHE": str(hosts / "d")}.items():
            patch.setenv(name, value)
        from ragen_core.storage.storecopy import open_store_root

        root = open_store_root(url)
    return root, kept, _keys(s3_server, bucket)


def _stage_records(keys: list[str]) -> list[int]:
    """The iterations of the stage records in the bucket (``_staging/<run>/<iteration>/<stage>/_DONE.json``)."""
    prefix = f"lake/_staging/{RUN}/"
    return sorted(
        {int(k[len(prefix) :].split("/")[0]) for k in keys if k.startswith(prefix) and k.endswith("/_DONE.json")}
    )


def test_each_kill_leaves_the_commits_and_the_batches_sampled_ahead_that_they_waited_for(resumed):
    _, kept, keys = resumed
    # killed after the hand-off of step 1 (before its commit): iteration 0 committed, with the batches of 1 and 2,
    # which its commit waited for (the policy after update 0 sampled them and is gone: host B resumes only because
    # it finds them, tests/flows/test_async.py's refusal otherwise), not batch 3, sampled in step 1; killed in the
    # checkpoint of the commit of 3: 0-2 committed, with the batches of 3 and 4 (the final validation is iteration
    # 5, as the run has 5 updates)
    assert [(_committed(k), _stage_records(k)) for k in kept] == [([0], [1, 2]), ([0, 1, 2], [3, 4])]
    assert _committed(keys) == list(range(ITERATIONS + 1))
    assert _stage_records(keys) == []  # each went with the commit of its iteration
    assert not any(k.startswith("lake/_uploads/") for k in keys)


def test_the_run_ends_bitwise_like_the_async_run_that_never_stopped(whole, resumed):  # noqa: F811 (the fixture)
    root = resumed[0]
    folder = ("runs", RUN, "checkpoints", f"iteration={ITERATIONS}", "hf", "model.safetensors")
    expected, actual = load_file(whole.joinpath(*folder)), load_file(root.joinpath(*folder))
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    for table in TABLES:
        expected_rows, actual_rows = _rows(whole, table), _rows(root, table)
        assert actual_rows == expected_rows and len(actual_rows) == len(set(actual_rows)) > 0, table
    manifest = DataLake(root).read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == 2
