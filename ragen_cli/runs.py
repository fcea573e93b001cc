"""``ragen runs``: list, remove and compact the runs of a data root."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from ragen_cli.common import (
    DATA_ROOT_HELP,
    OUTPUT_FORMATS,
    check_output,
    checked_run_id,
    console,
    existing_root,
    fail,
    warn,
    write_result,
)

RUNS_FOOTNOTE = (
    "iterations: committed iterations, the final validation included (a completed run of N iterations shows N + 1: "
    "iterations 0 to N-1 each validate when due, then update; iteration N validates the last update). "
    "val_iteration: the last validated iteration. mfu: the updates' mean model FLOPs utilisation (perf/mfu; "
    "docs/usage.md). config_hash: the first 8 hex digits of the run's config hash as it "
    "is now: extending a run (trainer.iterations) changes it, while a default run id <env>-<hash>-<time> keeps the "
    "hash the run started with."
)

runs_app = typer.Typer(help="List, remove and compact the runs of a data root.", add_completion=False)


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    output_format: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
) -> None:
    """List the runs: status, config hash, committed iterations, last validation success, created_at. A manifest
    that cannot be read is listed with status 'broken' (the reason on stderr, exit status 1); a damaged table file
    fails the listing, naming the file."""
    ctx.obj = data_root
    if ctx.invoked_subcommand is not None:
        return
    from ragen_core.storage import DataLake, LakeError
    from ragen_core.storage.catalog import read_manifests
    from ragen_core.storage.maintenance import runs_overview

    root = existing_root(data_root, store="read")
    check_output(output_format, None, root, OUTPUT_FORMATS[:3])
    lake = DataLake(root)
    try:
        overview = runs_overview(lake)
    except LakeError as exc:
        fail(str(exc))
    if overview.num_rows == 0 and output_format == "table":
        console.print(f"no runs in {escape(str(root))}", highlight=False)
        return
    write_result(overview, output_format, None)
    if output_format == "table":
        console.print(RUNS_FOOTNOTE, highlight=False, soft_wrap=True)
    problems = read_manifests(lake)[1]
    for problem in problems:
        warn(problem)
    if problems:
        raise typer.Exit(code=1)  # listed, but the data root is damaged: never a silent success


@runs_app.command("rm")
def runs_rm(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="The run to remove."),
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(
        False, "--force", help="Remove even when the manifest says 'running' (never while a live process writes it)."
    ),
) -> None:
    """Remove a run: its rows in every table, staging, commits, quarantine, manifest, checkpoints, owned models."""
    from ragen_core.storage import DataLake, LakeError
    from ragen_core.storage.maintenance import plan_removal, remove_run

    checked_run_id(run_id)  # a name, never a pattern: 'a*' must not reach another run's files
    root = existing_root(data_root or ctx.obj, store="write")
    lake = DataLake(root)
    try:
        plan = plan_removal(lake, run_id, force=force)
    except LakeError as exc:
        fail(str(exc))
    console.print(
        f"run [bold]{escape(run_id)}[/] (status {escape(plan.status or 'no manifest')}) in {escape(str(root))}; "
        "this removes:",
        highlight=False,
    )
    for line in plan.describe(root):
        console.print(f"  {escape(line)}", highlight=False)
    for warning in plan.warnings:
        warn(warning)
    if not yes and not typer.confirm("Remove it?", default=False):
        console.print("nothing removed")
        raise typer.Exit(code=1)
    try:
        remove_run(lake, plan)
    except LakeError as exc:
        fail(str(exc))
    console.print(f"removed run {run_id}")


@runs_app.command("compact")
def runs_compact(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="The run whose part files to merge."),
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    table: list[str] | None = typer.Option(None, "--table", help="Only this table (repeatable)."),
) -> None:
    """Merge a run's part files into one file per (table, committed iteration); readers never see rows missing or
    doubled, and a crash midway leaves the old or the new files visible."""
    from ragen_core.storage import DataLake, LakeError
    from ragen_core.storage.maintenance import compact_run
    from ragen_core.storage.maintenance.housekeeping import runs_with_data

    checked_run_id(run_id)
    root = existing_root(data_root or ctx.obj, store="write")
    lake = DataLake(root)
    if run_id not in runs_with_data(lake):
        fail(f"unknown run {run_id!r} in {root}; list the runs with `ragen runs`")
    try:
        report = compact_run(lake, run_id, table or None)
    except LakeError as exc:
        fail(str(exc))
    partitions = len(report.compacted)
    console.print(
        f"run {run_id}: merged {partitions} partition(s), {report.files_removed + partitions} files -> {partitions}"
    )
    if report.skipped_uncommitted:
        skipped = ", ".join(f"{t}/{i}" for t, i in report.skipped_uncommitted)
        console.print(f"left alone (iterations not committed yet): {skipped}")
