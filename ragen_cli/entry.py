"""The ``ragen`` command line itself, before its commands: the app (its commands listed in the order of a user's day,
one line each; ``--version``) and how it runs (:func:`run_app`: a usage mistake is one line on stderr). The commands
register on :data:`app` in :mod:`ragen_cli.main`."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from ragen_cli.common import console, err_console, one_line, say

# `ragen --help` lists the commands in the order of a user's day, each with one line (the full text: COMMAND --help)
SHORT_HELP = {
    "train": "Train a policy with StarPO / StarPO-S: a config and key.sub=value overrides.",
    "resume": "Continue a run from its last committed iteration (or extend it).",
    "eval": "Evaluate a run's checkpoint or a model folder on fixed validation instances.",
    "retrain": "Re-train a model offline on stored trajectories, as a new run.",
    "sweep": "A grid or random sweep of configs x seeds, one run each, then their comparison.",
    "runs": "List, remove and compact the runs of a data root.",
    "sql": "One read-only SQL query over the lake's tables.",
    "view": "Browse runs, iterations and trajectories in a local web viewer (read-only).",
    "plot": "Plot runs' collapse indicators (success, reward std, entropy, ...) into one PNG.",
    "export": "Write runs' rows as a dataset folder (load_dataset('parquet', data_dir=...)).",
    "reproduce": "Reproduce one of the paper's findings at tiny scale (--list lists them).",
    "config": "Show the config's keys: value, default and meaning.",
    "env": "Serve an environment over HTTP (OpenEnv's protocol) for runs to play with env.remote.",
    "group": "Join this host's ranks to a run's update group on several nodes (trainer.nnodes).",
    "rollout": "Serve the policy with vLLM on another host for runs to sample from (rollout.vllm.servers).",
    "server": "A local Prefect server and worker for the deployments in prefect.yaml.",
    "upgrade-lake": "Bring a data root written by an older ragen-flows to the current layout.",
}


class _Commands(TyperGroup):
    """The top-level group: its commands listed in :data:`SHORT_HELP`'s order."""

    def list_commands(self, ctx: Any) -> list[str]:
        order = list(SHORT_HELP)
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: order.index(name) if name in order else len(order))


app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="RAGEN-Flows: StarPO / StarPO-S agent RL.", cls=_Commands
)


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print ragen's version and exit.", is_eager=True),
) -> None:
    """RAGEN-Flows: StarPO / StarPO-S agent RL."""
    if version:
        from importlib import metadata

        try:
            number = metadata.version("ragen-flows")
        except metadata.PackageNotFoundError:  # a source checkout that was never installed
            number = "unknown (not installed)"
        console.print(f"ragen {number}")
        raise typer.Exit(0)


# the exceptions of the click that typer runs on (its own copy in recent typer versions, click itself before)
CLICK_ERRORS = sys.modules[typer.BadParameter.__module__]


def usage_error_line(exc: Exception) -> str:
    """A usage mistake (an unknown option, a missing argument, a value of the wrong type) in one line: what is wrong
    and where the command's options are listed. A ``ragen sql`` query that begins with a SQL comment (``-- ...``)
    reads as an option; the line says how to pass it."""
    command = exc.ctx.command_path if exc.ctx is not None else "ragen"
    message = one_line(exc.format_message())
    option = getattr(exc, "option_name", "") if isinstance(exc, CLICK_ERRORS.NoSuchOption) else ""
    is_sql = exc.ctx is not None and exc.ctx.command.name == "sql"
    if is_sql and option.startswith("--") and any(c.isspace() for c in option):
        return (
            f"{command}: a query that begins with a SQL comment ('--') reads as an option; put -- before it, "
            f'after the options (ragen sql --run ID -- "..."), or read it from a file (ragen sql --file '
            "query.sql)"
        )
    return f"{command}: {message} (see '{command} --help')"


def run_app(args: list[str] | None = None, application: typer.Typer | None = None) -> int:
    """Run the command line (``application``: ragen's) and return its exit status. Usage mistakes are one line on
    stderr (exit status 2), not click's box; everything else is as typer runs it (a ``SystemExit`` or another
    exception of a command goes on up)."""
    try:
        status = (application or app)(args=args, standalone_mode=False)
    except CLICK_ERRORS.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `ragen` or `ragen runs` alone: its help is already shown
            return exc.exit_code
        say("error", usage_error_line(exc))
        return exc.exit_code
    except CLICK_ERRORS.ClickException as exc:
        say("error", exc.format_message())
        return exc.exit_code
    except typer.Abort:  # a prompt answered with Ctrl-D (or Ctrl-C: then main says it, once)
        from ragen_cli import interrupts

        if not interrupts.requested():
            err_console.print("Aborted.")
        return 1
    return status if isinstance(status, int) else 0
