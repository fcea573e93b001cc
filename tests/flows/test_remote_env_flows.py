"""A run that plays its env on a server (``env.remote``, ``ragen env serve``) is, row for row and weight for weight,
the run that plays the env in process; a server killed mid-run (SIGKILL) stops the run in one line naming the server
and the call, the run ``failed``; started again, ``ragen resume`` continues it to bitwise the run that never stopped.
Multi-turn FrozenLake, so the served env is asked for held-out maps, its teacher and its descriptions too."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from ragen_core.storage import DataLake
from tests.envs.env_servers import port_of, serve, stop
from tests.flows.test_resume import RUN, _ragen, _rows, _weights

pytestmark = pytest.mark.process  # env servers and `ragen` commands


def _args(model_dir) -> list[str]:
    return [
        "train",
        "--config",
        "configs/frozenlake.yaml",
        "--run-id",
        RUN,
        f"model.path={model_dir}",
        "seed=5",
        "env.max_turns=3",
        "env.max_actions_per_traj=3",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "algorithm.filter_ratio=1.0",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=3",
        "trainer.num_threads=1",
        "trainer.checkpoint_every=2",
        "eval.every=1",
        "eval.instances=2",
        "bootstrap.enabled=false",
        "monitor.truncated_share=null",
    ]


def _kill_after_first_commit(root, process, done: threading.Event) -> None:
    """SIGKILL the server once the run committed iteration 0 (more iterations then need it)."""
    while not done.is_set():
        try:
            if 0 in DataLake(root).committed_iterations(RUN):
                stop(process, signal.SIGKILL)
                return
        except Exception:  # noqa: BLE001 - the run's folders are not made yet
            pass
        time.sleep(0.05)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tiny_policy, prefect_server):
    from ragen_core.training import ActorEngine, OptimConfig

    model, _ = tiny_policy  # DeepSpeed's CPU op, compiled here, never inside a process that gets killed
    ActorEngine(model, OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    folder, api_url, args = tmp_path_factory.mktemp("remote-runs"), prefect_server[0].api_url, _args(tiny_model_dir)
    here, there, killed = folder / "here", folder / "there", folder / "killed"
    for root in (here, there, killed):
        root.mkdir()
    rc, output = _ragen(args, here, None, api_url)
    assert rc == 0, output[-3000:]
    process, url = serve("frozen_lake", folder / "server.log", "-o", "is_slippery=false")
    try:
        rc, output = _ragen([*args, f"env.remote={url}"], there, None, api_url)
        assert rc == 0, output[-3000:]
        done = threading.Event()
        killer = threading.Thread(target=_kill_after_first_commit, args=(killed, process, done), daemon=True)
        killer.start()
        rc, failed = _ragen([*args, f"env.remote={url}"], killed, None, api_url)
        done.set()
        killer.join()
        status = DataLake(killed).read_manifest(RUN).status
        process, again = serve("frozen_lake", folder / "again.log", "-o", "is_slippery=false", port=port_of(url))
        assert again == url
        rc_resumed, resumed = _ragen(["resume", RUN], killed, None, api_url)
        assert rc_resumed == 0, resumed[-3000:]
    finally:
        stop(process)
    return {"here": here, "there": there, "killed": killed, "url": url, "failed": (rc, failed, status)}


TABLES = ["trajectories", "turns", "metrics", "evaluations"]


@pytest.mark.parametrize("table", TABLES)
def test_a_run_on_a_served_env_has_the_rows_of_the_run_in_process(runs, table):
    def rows(root):  # the config hash differs: env.remote is part of the config
        return [row.replace(_hash(root), "HASH") for row in _rows(root, table)]

    here, there = rows(runs["here"]), rows(runs["there"])
    assert len(there) == len(set(there)) == len(here) > 0
    assert there == here


def _hash(root) -> str:
    return DataLake(root).read_manifest(RUN).config_hash


def test_a_run_on_a_served_env_ends_with_the_weights_of_the_run_in_process(runs):
    expected, actual = _weights(runs["here"]), _weights(runs["there"])
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    sources = DataLake(runs["there"]).read_manifest(RUN).code_sources
    in_process = DataLake(runs["here"]).read_manifest(RUN).code_sources
    assert sources["frozen_lake"] == {**in_process["frozen_lake"], "remote": runs["url"]}  # the server's code, named


def test_a_killed_server_fails_the_run_in_one_line_naming_it_and_the_call(runs):
    rc, output, status = runs["failed"]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert rc == 2 and status == "failed", output[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: the env server {runs['url']} is unreachable on POST /")
    assert "goes on with `ragen resume`" in errors[0] and "Traceback" not in output


@pytest.mark.parametrize("table", TABLES)
def test_the_resumed_run_has_bitwise_the_rows_of_the_run_that_never_stopped(runs, table):
    expected, actual = _rows(runs["there"], table), _rows(runs["killed"], table)
    assert len(actual) == len(set(actual)) == len(expected)
    assert actual == expected


def test_the_resumed_run_ends_with_bitwise_the_weights_of_the_run_that_never_stopped(runs):
    expected, actual = _weights(runs["there"]), _weights(runs["killed"])
    assert all(torch.equal(expected[k], actual[k]) for k in expected)
    manifest = DataLake(runs["killed"]).read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == 1
