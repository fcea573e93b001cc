"""``ragen server``: a local Prefect server (127.0.0.1) and process worker for the deployments in prefect.yaml."""

from __future__ import annotations

from pathlib import Path

import typer

from ragen_cli.common import console, fail

server_app = typer.Typer(
    help="A local Prefect server (127.0.0.1) + process worker for the deployments in prefect.yaml.",
    add_completion=False,
)
STATE_HELP = "Folder of the server's state (PIDs, logs, its PREFECT_HOME)."


@server_app.command("start")
def server_start(
    port: int = typer.Option(4200, "--port", help="Port on 127.0.0.1 (0: any free port)."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP + " Default .prefect-local/."),
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Also start a process worker for the pool."),
    deploy: bool = typer.Option(True, "--deploy/--no-deploy", help="Deploy prefect.yaml's deployments."),
) -> None:
    """Start the server, create the `local-process` pool, deploy prefect.yaml and start a worker (all by PID)."""
    from ragen_cli.launch import print_step
    from ragen_cli.local_server import DEFAULT_STATE_DIR, ServerError, start

    try:
        state = start(port, state_dir or DEFAULT_STATE_DIR, worker=worker, deploy=deploy, step=print_step)
    except ServerError as exc:
        fail(str(exc))
    console.print(f"Prefect server {state.api_url} (pid {state.server_pid}), worker pid {state.worker_pid}")
    console.print(f"UI: {state.api_url.removesuffix('/api')}  ·  use it with: export PREFECT_API_URL={state.api_url}")


@server_app.command("stop")
def server_stop(state_dir: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP)) -> None:
    """Stop the worker (SIGINT) and the server (SIGTERM) that `ragen server start` recorded."""
    from ragen_cli.local_server import DEFAULT_STATE_DIR, stop

    console.print("stopped" if stop(state_dir or DEFAULT_STATE_DIR) else "no server recorded; nothing to stop")


@server_app.command("status")
def server_status(state_dir: Path | None = typer.Option(None, "--state-dir", help=STATE_HELP)) -> None:
    """Say whether the recorded server and worker are alive."""
    from ragen_cli.local_server import DEFAULT_STATE_DIR, alive, read_state

    state = read_state(state_dir or DEFAULT_STATE_DIR)
    if state is None:
        console.print("no server recorded")
        raise typer.Exit(code=1)
    worker = f"worker pid {state.worker_pid} alive: {alive(state.worker_pid)}" if state.worker_pid else "no worker"
    console.print(f"{state.api_url} server pid {state.server_pid} alive: {alive(state.server_pid)} · {worker}")
