"""`ragen server start` (`make server`) says each step before it takes it (issue 40, section 4 item 3: it was silent
for the minute the server takes to start). The processes are stand-ins: what is checked is the order of lines and
actions."""

from __future__ import annotations

from types import SimpleNamespace

from ragen_cli import local_server


def test_each_step_is_said_before_it_is_taken(tmp_path, monkeypatch):
    done: list[str] = []
    monkeypatch.setattr(local_server, "check_port_free", lambda port: None)
    monkeypatch.setattr(local_server.prefect_template, "seed", lambda home: None)
    monkeypatch.setattr(local_server.prefect_template, "save", lambda home: None)
    server = SimpleNamespace(pid=11, poll=lambda: None)
    monkeypatch.setattr(local_server, "_spawn", lambda *a: done.append("spawn") or server)
    monkeypatch.setattr(local_server, "wait_healthy", lambda *a: done.append("healthy"))
    monkeypatch.setattr(local_server, "ensure_pool", lambda env: done.append("pool"))
    monkeypatch.setattr(local_server, "run_prefect", lambda args, env: done.append(" ".join(args)))
    worker = SimpleNamespace(pid=12)
    monkeypatch.setattr(local_server, "start_worker", lambda env, log: done.append("worker") or worker)
    state = local_server.start(4321, tmp_path, step=lambda text: done.append(f"said: {text}"))
    assert (state.server_pid, state.worker_pid) == (11, 12)
    assert done == [
        f"said: starting the Prefect server on 127.0.0.1:4321 (log: {tmp_path / 'server.log'}; up to 180 s)",
        "spawn",
        "healthy",
        "said: the server answers; creating the work pool local-process",
        "pool",
        "said: deploying prefect.yaml's deployments (prefect deploy --all)",
        "--no-prompt deploy --all",
        f"said: starting a process worker for local-process (log: {tmp_path / 'worker.log'})",
        "worker",
    ]
