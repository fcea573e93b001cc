"""``ragen group join``: another node's ranks join a run's launched update group (trainer.nnodes > 1)."""

from __future__ import annotations

import typer

from ragen_cli.common import console, fail

group_app = typer.Typer(
    help="The launched update group across nodes: join this host's ranks to a run's group (trainer.nnodes > 1).",
    add_completion=False,
    no_args_is_help=True,
)


@group_app.command("join")
def group_join(
    endpoint: str = typer.Argument(..., help="The run's trainer.rdzv_endpoint, HOST:PORT of node 0."),
    nnodes: int = typer.Option(..., "--nnodes", help="The run's trainer.nnodes (this node included)."),
    node_rank: int = typer.Option(
        ...,
        "--node-rank",
        help="This node's rank, 1 .. nnodes-1, each node its own (node 0 is the run's host); in an srun over the "
        "other nodes: $((SLURM_PROCID + 1)).",
    ),
    nproc: int = typer.Option(..., "--nproc", help="The run's trainer.nproc: ranks on this node (one per GPU)."),
) -> None:
    """Start this host's ranks of a run's update group and serve it until the run's session ends (the group
    stops: exit 0) or the group fails (non-zero, its log named). Start it on each other node while (or before) the
    run starts on node 0 with trainer.launcher=torchrun trainer.nnodes=N trainer.rdzv_endpoint=HOST:PORT; each node
    waits for the others (up to 10 minutes: torchrun's rendezvous timeout). Every host needs this project's
    environment, and the data root and model folders at the same paths. A resume starts a new group: join again."""
    from ragen_cli import interrupts
    from ragen_core.training.nodes import check_join, last_error, run_node

    try:
        check_join(endpoint, nnodes, node_rank, nproc)  # every argument checked before anything starts
    except ValueError as exc:
        fail(str(exc))
    console.print(
        f"ragen group join: node {node_rank} of {nnodes} ({nproc} rank(s)) at {endpoint}; waiting for the group",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    end = run_node(endpoint, nnodes, node_rank, nproc)
    if end.signal is not None:
        interrupts.note_signal(end.signal)
        interrupts.report(f"interrupted: node {node_rank} left the update group (its log: {end.log})")
        raise typer.Exit(interrupts.exit_code())
    if end.code != 0:
        reason = last_error(end.log)
        fail(
            f"node {node_rank}'s ranks ended with exit code {end.code}"
            + (f" ({reason})" if reason else "")
            + f"; its log: {end.log}. The run's update group ends with it: join again when the run resumes"
        )
    console.print(f"ragen group join: the run stopped its update group; node {node_rank} is done", highlight=False)
