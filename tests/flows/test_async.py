"""An async run (``trainer.max_staleness=2``) killed (SIGKILL, via RAGEN_FAULT) at three points and resumed each time
ends bitwise equal to the async run that never stopped, and the batches it had finished are kept and used, never
regenerated. Both runs are the real command, talking to the test session's Prefect server (a temporary server per
command costs seconds each and is tested elsewhere: tests/flows/test_interrupts.py)."""

from __future__ import annotations

import signal

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake, Stage, query
from ragen_core.storage.layout import published_by_stage
from tests.flows.test_resume import _overrides as resume_overrides
from tests.flows.test_resume import _ragen, _rows

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
