"""An async run (``trainer.max_staleness=2``) killed (SIGKILL, via RAGEN_FAULT) at three points and resumed each time
ends bitwise equal to the async run that never stopped, and the batches it had finished are kept and used, never
regenerated; so does one whose sampler process was SIGKILLed (the command says so in one line). An async run stopped
(Ctrl-C, SIGTERM) right after its last commit ends completed or interrupted, never `running`, and a resume leaves it
completed. The same run with its data root in a bucket, killed and resumed across hosts, ends bitwise the same. Every
run is the real command, talking to the test session's Prefect server (a temporary server per command costs seconds
each and is tested elsewhere: tests/flows/test_interrupts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake, Stage, query
from ragen_core.storage.layout import published_by_stage
from tests.flows.test_resume import DISTRIBUTED, _ragen, _rows
from tests.flows.test_resume import _overrides as resume_overrides
from tests.flows.test_store_root import _committed, _keys
from tests.flows.test_store_root import _ragen as _store_ragen

RUN = "r"  # tests.flows.test_resume._rows reads this run
ITERATIONS = 5
FAULTS = [
    "rollout:inside@3",  # in the sampler lane, sampling batch 3 while update 1 runs
    "handoff:after@1",  # the sampler holds the policy after update 2; batch 4 comes next
    "checkpoint:mid_save@4",  # in the commit of iteration 3, the checkpoint half written
]


def async_overrides(model_dir, staleness: int, iterations: int, eval_every: int) -> list[str]:
    """tests/flows/test_resume.py's tiny Bandit run, asynchronous: ``staleness`` batches ahead, a checkpoint after
    every update."""
    changed = {
        "trainer.iterations": iterations,
        "trainer.checkpoint_every": 1,
        "eval.every": eval_every,
        "trainer.max_staleness": staleness,
    }
    kept = [o for o in resume_overrides(model_dir) if o.split("=", 1)[0] not in changed]
    return [*kept, *(f"{key}={value}" for key, value in changed.items())]


def _batch_files(root) -> dict[int, tuple[int, int]]:
    """Each published training batch's trajectories part file: (inode, modification time in ns), by iteration."""
    lake, found = DataLake(root), {}
    for iteration in range(ITERATIONS):
        folder = lake.partition_dir("trajectories", RUN, iteration)
        files = (
            [p for p in folder.glob("part-*") if published_by_stage(p.name, [Stage.ROLLOUT])]
            if folder.is_dir()
            else []
        )
        if files:
            [path] = files
            found[iteration] = (path.stat().st_ino, path.stat().st_mtime_ns)
    return found


def _train(model_dir) -> list[str]:
    return ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *async_overrides(model_dir, 2, ITERATIONS, 2)]


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture(scope="module")
def killed(tmp_path_factory, tiny_model_dir, prefect_harness):
    """The run killed at each of FAULTS and resumed to its end: its data root, and the batch files after each kill.
    (Its own fixture, apart from the run that never stopped, so that no one test's set-up makes all five runs.)"""
    root, published = tmp_path_factory.mktemp("killed-async"), []
    for attempt, fault in enumerate(FAULTS):
        args = _train(tiny_model_dir) if attempt == 0 else ["resume", RUN]
        rc, output = _ragen(args, root, fault, _api_url())
        assert rc == -signal.SIGKILL, f"{fault}: exit {rc}\n{output[-3000:]}"
        published.append(_batch_files(root))
    rc, output = _ragen(["resume", RUN], root, api_url=_api_url())
    assert rc == 0, output[-3000:]
    return root, published


@pytest.fixture(scope="module")
def whole(tmp_path_factory, tiny_model_dir, prefect_harness):
    """The same async run, never stopped."""
    root = tmp_path_factory.mktemp("whole-async")
    rc, output = _ragen(_train(tiny_model_dir), root, api_url=_api_url())
    assert rc == 0, output[-3000:]
    return root


def test_finished_batches_are_kept_and_used_not_made_again(killed):
    root, published = killed
    final = _batch_files(root)
    # killed sampling batch 3: batches 0-2 were published (commit 0 waited for batch 2); they are the files trained on
    assert sorted(published[0]) == [0, 1, 2]
    assert all(final[i] == published[0][i] for i in (0, 1, 2))
    # killed after the hand-off of step 1, before its commit: batch 3 (sampled in step 1) was published, but no
    # commit waited for it, so it was made again by the same policy (the restored one); batches 1 and 2 were kept
    assert sorted(published[1]) == [0, 1, 2, 3]
    assert final[3] != published[1][3]
    # killed in the commit of iteration 3: batch 4, which the commit of 2 waited for, was kept, and batch 3 too
    assert sorted(published[2]) == [0, 1, 2, 3, 4]
    assert final[3] == published[2][3] and final[4] == published[2][4]
    manifest = DataLake(root).read_manifest(RUN)
    assert manifest.status == "completed"
    assert [attempt.get("next_iteration") for attempt in manifest.resumes] == [1, 1, 3]


def test_the_policy_version_of_every_batch_is_the_schedules(killed):
    root, _ = killed
    rows = query(
        root,
        "SELECT split, iteration, min(policy_version) AS low, max(policy_version) AS high FROM trajectories "
        "GROUP BY ALL ORDER BY ALL",
    ).to_pylist()
    train = [(r["iteration"], r["low"], r["high"]) for r in rows if r["split"] == "train"]
    assert train == [(i, max(0, i - 2), max(0, i - 2)) for i in range(ITERATIONS)]


def test_the_final_weights_are_bitwise_those_of_the_run_that_never_stopped(whole, killed):
    folder = f"runs/{RUN}/checkpoints/iteration={ITERATIONS}/hf/model.safetensors"
    expected, actual = load_file(whole / folder), load_file(killed[0] / folder)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_every_table_holds_exactly_the_same_rows(whole, killed, table):
    expected, actual = _rows(whole, table), _rows(killed[0], table)
    assert len(actual) == len(set(actual)) == len(expected)
    assert actual == expected


def _start(args: list[str], root) -> tuple[subprocess.Popen, Path]:
    """`ragen <args>` in a session of its own (its own process group, as a terminal's job), talking to the session's
    Prefect server; stdout and stderr to files: (the process, the stderr file)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED} | {"PREFECT_API_URL": _api_url()}
    err = Path(root).with_suffix(".err")
    with open(Path(root).with_suffix(".out"), "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("ragen")), *args, "--data-root", str(root)],
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )
    return process, err


def _wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the command exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.005)


@pytest.mark.parametrize(
    ("signum", "delay"),
    [(signal.SIGINT, 0.0), (signal.SIGTERM, 0.25)],
    ids=["ctrl-c-at-the-last-commit", "sigterm-while-it-closes"],
)
def test_an_async_run_stopped_after_its_last_commit_ends_completed_or_interrupted_and_resume_completes_it(
    tmp_path, tiny_model_dir, prefect_harness, signum, delay
):
    """Issue 66, item 4: a stop right after an async run's last commit (its final validation) used to leave it
    `running` for good when it landed while the run closed (joining its sampler process), and `interrupted` with
    every iteration committed when it landed in the commit's last steps, which `ragen resume` then called "already
    completed" and left so. Ctrl-C (the whole process group) right at the commit marker, and SIGTERM (the command
    alone) a moment later: the run ends completed or interrupted, and a resume leaves it completed."""
    root = tmp_path / "stopped"
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *async_overrides(tiny_model_dir, 1, 2, 1)]
    process, err = _start(train, root)
    try:
        lake = DataLake(root)
        _wait_for(lambda: 2 in lake.committed_iterations(RUN), process, "the final validation's commit")
        time.sleep(delay)
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)  # what Ctrl-C on the terminal does: the whole foreground group
        else:
            os.kill(process.pid, signum)
        assert process.wait(timeout=120) == 128 + signum
    finally:
        _reap(process)
    stderr = err.read_text()
    assert "Traceback" not in stderr and len(_said(err)) == 1, stderr[-3000:]
    manifest = lake.read_manifest(RUN)
    assert lake.committed_iterations(RUN) == [0, 1, 2]
    assert manifest.status in ("completed", "interrupted"), manifest
    assert manifest.last_committed_iteration == 2, manifest

    rc, output = _ragen(["resume", RUN], root, api_url=_api_url())
    assert rc == 0, output[-3000:]
    if manifest.status == "completed":
        assert f"run {RUN} is already completed; nothing to do" in output, output[-3000:]
    else:
        assert "is recorded completed now" in output and "already completed" not in output, output[-3000:]
    resumed = lake.read_manifest(RUN)
    assert resumed.status == "completed" and resumed.last_committed_iteration == 2, resumed
    assert resumed.interrupted_iteration is None and resumed.interrupted_stage is None
    assert lake.committed_iterations(RUN) == [0, 1, 2]


def _said(err: Path) -> list[str]:
    """The command's lines on stderr but its notes (the overlap hint of a loaded machine: ragen_cli.launch)."""
    return [line for line in err.read_text().splitlines() if line.strip() and not line.startswith("note: ")]


def _reap(process: subprocess.Popen) -> None:
    """Kill whatever the command left in its process group."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_killed_sampler_process_is_one_line_naming_it_and_its_log_and_resume_is_bitwise(
    whole, tmp_path_factory, tiny_model_dir, prefect_harness
):
    """Issue 66, item 4: the sampler process SIGKILLed while the run trains (after commit 1, batch 3 sampled ahead)
    stops the command with one line naming the process and its log (it was a 406-line traceback), exit status 2,
    the run `failed` with that line; `ragen resume` then ends it bitwise the async run that never stopped."""
    root = tmp_path_factory.mktemp("sampler-killed")
    process, err = _start(_train(tiny_model_dir), root)
    lake = DataLake(root)
    try:
        _wait_for(lambda: 1 in lake.committed_iterations(RUN), process, "the commit of iteration 1")
        [sampler] = [
            child
            for child in psutil.Process(process.pid).children(recursive=True)
            if "ragen_core.rollout.sampler" in child.cmdline()
        ]
        sampler.kill()
        assert process.wait(timeout=300) == 2
    finally:
        _reap(process)
    stderr = err.read_text()
    log = root / "runs" / RUN / "sampler" / "sampler.log"
    assert "Traceback" not in stderr and len(_said(err)) == 1, stderr[-3000:]
    [line] = _said(err)
    assert line.startswith(f"error: the sampler process (pid {sampler.pid}) died (killed by SIGKILL) during "), line
    assert f"see its log {log}" in line, line
    manifest = lake.read_manifest(RUN)
    assert manifest.status == "failed" and manifest.error.startswith("SamplerError: the sampler process"), manifest
    assert lake.committed_iterations(RUN)[-1] < ITERATIONS  # it stopped part-way

    rc, output = _ragen(["resume", RUN], root, api_url=_api_url())
    assert rc == 0, output[-3000:]
    assert lake.read_manifest(RUN).status == "completed"
    folder = f"runs/{RUN}/checkpoints/iteration={ITERATIONS}/hf/model.safetensors"
    expected, actual = load_file(whole / folder), load_file(root / folder)
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    for table in ("trajectories", "turns", "metrics", "evaluations"):
        assert _rows(root, table) == _rows(whole, table), table


@pytest.mark.process  # a `ragen train` killed, then `ragen resume`
def test_a_resume_lacking_a_batch_only_a_gone_policy_could_sample_is_one_line(tmp_path_factory, tiny_model_dir):
    """A batch sampled ahead by a policy that is gone since (the policy after update 0: batch 1 of a run killed in
    step 1), its record removed (by hand, or a lake copied without it): the resume stops in one line saying what to
    do, exit status 2, nothing of the run changed (it was a traceback)."""
    from ragen_core.storage.layout import done_marker

    root = tmp_path_factory.mktemp("batch-gone")
    rc, output = _ragen(_train(tiny_model_dir), root, "handoff:after@1", _api_url())
    assert rc == -signal.SIGKILL, output[-3000:]
    lake = DataLake(root)
    done_marker(lake.stage_dir(RUN, 1, Stage.ROLLOUT)).unlink()
    committed = lake.committed_iterations(RUN)
    rc, output = _ragen(["resume", RUN], root, api_url=_api_url())
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert rc == 2 and "Traceback" not in output and len(errors) == 1, output[-3000:]
    assert errors[0].startswith(f"error: run '{RUN}' has no published training batch for iteration 1, "), errors
    assert "Start a new run from the last checkpoint instead" in output
    assert lake.committed_iterations(RUN) == committed == [0]


# The same async run with its data root in a bucket (issue 71): killed on host A after a hand-off (a batch sampled
# ahead published, its iteration not committed), resumed on host B (a local copy of its own) and killed in a commit's
# checkpoint, resumed on host A to its end: the final weights and every table's rows equal those of the run that
# never stopped on a local disk (``whole``, built once for both). A batch sampled ahead lives in the copy that sampled
# it until the commit that waited for it uploads it with its own files; the host that resumes finds it in the bucket,
# or samples it again with the same policy.

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
        rc, output = _store_ragen(args, url, hosts / host, env, fault, _api_url())
        assert rc == -signal.SIGKILL, f"{fault}: exit {rc}\n{output[-3000:]}"
        kept.append(_keys(s3_server, bucket))
    rc, output = _store_ragen(["resume", RUN], url, hosts / "a", env, None, _api_url())
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


def test_on_a_bucket_each_kill_leaves_the_commits_and_the_batches_sampled_ahead_they_waited_for(resumed):
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


def test_on_a_bucket_the_run_ends_bitwise_like_the_async_run_that_never_stopped(whole, resumed):
    root = resumed[0]
    folder = ("runs", RUN, "checkpoints", f"iteration={ITERATIONS}", "hf", "model.safetensors")
    expected, actual = load_file(whole.joinpath(*folder)), load_file(root.joinpath(*folder))
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    for table in ("trajectories", "turns", "metrics", "evaluations"):
        expected_rows, actual_rows = _rows(whole, table), _rows(root, table)
        assert actual_rows == expected_rows and len(actual_rows) == len(set(actual_rows)) > 0, table
    manifest = DataLake(root).read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == 2
