"""Several vLLM rollout servers (issue 70): the run's own server and one started as another host starts it, by
docs/cluster.md's `ragen rollout serve` (its own session and working folder, on loopback), through the real command
and the whole iteration flow on multi-turn FrozenLake.

- A run on two servers stores exactly the rows (and ends on exactly the weights) of the same run on one server with
  the same ``rollout.vllm.shards``; the other host's server received the run's weights and outlives the run.
- The other host's server SIGKILLed in the middle of iteration 2's rollouts stops the run in one line naming it, with
  nothing of the iteration stored; started again, ``ragen resume`` (naming the servers again: a stored config sends
  the token to no URL by itself) ends bitwise like the run that never stopped, and so does a resume on the run's own
  server alone; a resume that does not name them is refused in one line.
- ``rollout.vllm.on_server_loss=continue``: the run goes on without the lost server, saying so once.

Skipped without the vLLM environment (`make install-vllm`); CI sets ``RAGEN_REQUIRE_VLLM=1`` and builds it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ragen_core.storage import DataLake
from tests.flows.test_resume import RUN, _ragen
from tests.flows.test_vllm_runs import same_as_whole, stopped_state
from tests.vllm_env import TOKEN, documented_servers, require_vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.process]
TABLES = ["trajectories", "turns", "metrics", "evaluations"]
KILLED = "rollout:server_killed@2"  # the last server listed (the other host's) SIGKILLed at iteration 2's first turn
SERVERS = "[local,{}]"  # the run's own server and the other host's (its URL)


@pytest.fixture(scope="module", autouse=True)
def rollout_token():
    """The run's side of the shared token (every `ragen` command of this module inherits it)."""
    before = os.environ.get("RAGEN_ROLLOUT_TOKEN")
    os.environ["RAGEN_ROLLOUT_TOKEN"] = TOKEN
    yield
    if before is None:
        os.environ.pop("RAGEN_ROLLOUT_TOKEN", None)
    else:
        os.environ["RAGEN_ROLLOUT_TOKEN"] = before


@pytest.fixture(scope="module")
def api_url(prefect_server) -> str:
    return prefect_server[0].api_url


def _train(model_dir: Path, servers: str, *extra: str) -> list[str]:
    """docs/cluster.md's train line, small: the test's model, run id and servers, 3 iterations of 4-turn episodes."""
    _, documented = documented_servers()
    args = [a for a in documented if not a.startswith(("model.path=", "rollout.vllm.servers=", "--run-id"))]
    args = [a for a in args if a != "lake-2x"]
    return [
        *args,
        "--run-id",
        RUN,
        f"model.path={model_dir}",
        f"rollout.vllm.servers={servers}",
        "rollout.vllm.enforce_eager=true",
        "seed=3",
        "env.max_turns=4",
        "rollout.env_groups=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "actor.mini_batch_size=8",
        "actor.micro_batch_size=8",
        "trainer.iterations=3",
        "trainer.num_threads=1",
        "trainer.checkpoint_every=1",
        "eval.every=3",
        "eval.instances=2",
        "bootstrap.enabled=false",
        "monitor.truncated_share=null",
        *extra,
    ]


@pytest.fixture(scope="module")
def one_server(tmp_path_factory, tiny_model_dir, api_url) -> Path:
    """The run on its own server alone, two shards: its data root."""
    require_vllm_python()
    root = tmp_path_factory.mktemp("one-server")
    rc, output = _ragen(_train(tiny_model_dir, "[local]"), root, None, api_url)
    assert rc == 0, output[-3000:]
    return root


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory, tiny_model_dir, api_url, other_host):
    """The same run on its own server and the other host's: (data root, the other server's health before, after)."""
    root = tmp_path_factory.mktemp("two-servers")
    before = other_host.health()
    rc, output = _ragen(_train(tiny_model_dir, SERVERS.format(other_host.url)), root, None, api_url)
    assert rc == 0, output[-3000:]
    return root, before, other_host.health()


def test_two_servers_store_the_rows_and_weights_of_one(one_server, two_servers):
    root, _, _ = two_servers
    same_as_whole(one_server, root)
    served = [r for r in DataLake(root).read_table("turns", RUN).to_pylist() if r["turn_index"] == 3]
    assert served, "no trajectory reached its fourth turn: the prefixes cached per part went untested"


def test_the_other_hosts_server_took_the_runs_weights_and_outlives_the_run(two_servers, other_host):
    _, before, after = two_servers
    assert before["state"] == after["state"] == "ready" and other_host.process.poll() is None
    assert before["pid"] == after["pid"]  # the same server: the run stopped nothing of another host's
    assert after["weights"] != before["weights"] and not after["weights"].startswith("start-")  # pushed to


@pytest.fixture(scope="module")
def killed(tmp_path_factory, tiny_model_dir, api_url, other_host):
    """The two-server run whose other-host server is SIGKILLed at iteration 2's first turn: (what the failed command
    printed and left, its root, a copy of the stopped root taken before any resume)."""
    root = tmp_path_factory.mktemp("server-killed")
    command = _train(tiny_model_dir, SERVERS.format(other_host.url))
    failed = stopped_state(*_ragen(command, root, KILLED, api_url), root)
    fewer = tmp_path_factory.mktemp("fewer-servers") / "root"
    shutil.copytree(root, fewer)
    return failed, root, fewer


@pytest.fixture(scope="module")
def resumed(killed, api_url, other_host):
    """The killed server started again by its host (same port), and the run resumed naming the servers again:
    (the resume's exit code, its output)."""
    other_host.start()
    return _ragen(["resume", RUN, f"rollout.vllm.servers={SERVERS.format(other_host.url)}"], killed[1], None, api_url)


@pytest.fixture(scope="module")
def on_one(killed, api_url):
    """The copy of the stopped run resumed on the run's own server alone: (exit code, output)."""
    return _ragen(["resume", RUN, "rollout.vllm.servers=[local]"], killed[2], None, api_url)


def test_a_lost_server_stops_the_run_in_one_line_naming_it(killed, other_host):
    failed = killed[0]
    errors = [line for line in failed["output"].splitlines() if line.startswith("error:")]
    assert failed["rc"] == 2 and len(errors) == 1 and "Traceback" not in failed["output"], failed["output"][-3000:]
    assert errors[0].startswith(f"error: the vLLM server 2 of 2 at {other_host.url} did not answer on /generate ("), (
        errors[0]
    )
    assert errors[0].endswith("is `ragen rollout serve` still running there?"), errors[0]
    assert failed["manifest"].status == "failed" and failed["manifest"].failed_iteration == 2
    assert failed["committed"] == [0, 1]
    assert failed["iterations"]["trajectories"] == [0, 1]  # nothing of iteration 2


def test_the_resume_with_the_server_back_ends_bitwise_like_the_run_that_never_stopped(one_server, killed, resumed):
    rc, output = resumed
    assert rc == 0 and "resumed at iteration 2" in output, output[-3000:]
    same_as_whole(one_server, killed[1])


def test_a_resume_on_fewer_servers_ends_bitwise_too(one_server, killed, on_one):
    rc, output = on_one
    assert rc == 0 and "resumed at iteration 2" in output, output[-3000:]
    same_as_whole(one_server, killed[2])


def test_a_resume_that_does_not_name_the_servers_again_is_refused_in_one_line(killed, resumed, api_url):
    root = killed[1]  # completed by the resume that named the servers
    rc, output = _ragen(["resume", RUN], root, None, api_url)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "sets rollout.vllm.servers=['local', 'http://127.0.0.1:" in errors[0], (
        output[-3000:]
    )
    assert 'pass \'rollout.vllm.servers=["local","http://127.0.0.1:' in errors[0], errors[0]
    assert DataLake(root).read_manifest(RUN).status == "completed"  # the refusal changed nothing


def test_on_server_loss_continue_goes_on_without_the_lost_server(tmp_path, tiny_model_dir, api_url, other_host):
    if other_host.process.poll() is not None:  # the kill above took it: its host starts it again
        other_host.start()
    extra = "rollout.vllm.on_server_loss=continue"
    rc, output = _ragen(_train(tiny_model_dir, SERVERS.format(other_host.url), extra), tmp_path, KILLED, api_url)
    assert rc == 0, output[-3000:]
    warnings = [line for line in output.splitlines() if line.startswith("warning: the vLLM server 2 of 2")]
    assert len(warnings) == 1 and "continuing on the other 1 server(s)" in warnings[0], output[-3000:]
    lake = DataLake(tmp_path)
    assert lake.committed_iterations(RUN) == [0, 1, 2, 3]
    assert lake.read_manifest(RUN).status == "completed"
