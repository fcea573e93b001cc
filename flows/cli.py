"""The ``ragen`` command line: train, resume, retrain, sql, runs (list, rm, compact)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RAGEN-Flows: StarPO / StarPO-S agent RL.")
console = Console()
DEFAULT_DATA_ROOT = "data"

SUMMARY_SQL = (
    "SELECT iteration, split, count(*) AS trajectories, round(avg(total_reward), 4) AS reward, "
    "round(avg(success::int), 4) AS success FROM trajectories WHERE run_id = '{run_id}' "
    "GROUP BY 1, 2 ORDER BY 1, 2"
)


def _data_root(value: Path | None) -> Path:
    return (value or Path(os.environ.get("RAGEN_DATA_ROOT", DEFAULT_DATA_ROOT))).resolve()


def _prepare_prefect(data_root: Path, run_id: str, verbose: bool) -> None:
    """Environment for Prefect, set before it is imported: no telemetry, a patient local server, and a Prefect home
    of the run's own attempt when no server is configured (two runs, or a resume and the server a killed attempt may
    have left behind, never share one SQLite file)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if "PREFECT_API_URL" not in os.environ and "PREFECT_HOME" not in os.environ:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        home = data_root / "_prefect" / run_id / f"{stamp}-{os.getpid()}"
        home.mkdir(parents=True, exist_ok=True)  # Prefect creates only the last level itself
        os.environ["PREFECT_HOME"] = str(home)


def _quiet_libraries() -> None:
    import logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in ("great_expectations", "DeepSpeed", "deepspeed", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Data root (default ./data or RAGEN_DATA_ROOT)."),
    run_id: str | None = typer.Option(
        None,
        "--run-id",
        help="Run id (default <env>-<hash>-<time>); an existing unfinished run with the same config is resumed.",
    ),  # fmt: skip
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's and the libraries' logs."),
) -> None:
    """Train with StarPO / StarPO-S. Extra arguments are key.sub=value overrides, e.g. trainer.iterations=5."""
    from ragen_core.config import ConfigError, load_config

    try:
        run_config = load_config(config, list(ctx.args))
    except ConfigError as exc:
        _fail(str(exc))
    from ragen_core.session import default_run_id

    _run(run_config, _data_root(data_root), run_id or default_run_id(run_config), verbose, [], False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def resume(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="The run to continue."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Data root (default ./data or RAGEN_DATA_ROOT)."),
    force_config: str = typer.Option(
        "",
        "--force-config",
        help="Comma-separated config keys (or sections) allowed "
        "to differ from the run's, e.g. trainer.iterations,eval.",
    ),  # fmt: skip
    skip_iteration: bool = typer.Option(
        False, "--skip-iteration", help="Record a quarantined iteration as skipped (no update) and go on."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's and the libraries' logs."),
) -> None:
    """Continue a run from its last committed iteration, with the run's own config. Extra key.sub=value
    overrides change it (only the keys listed in --force-config), e.g. trainer.iterations=50."""
    from ragen_core.config import ConfigError, build_config
    from ragen_core.storage import DataLake

    root = _data_root(data_root)
    manifest = DataLake(root).read_manifest(run_id) if root.is_dir() else None
    if manifest is None:
        _fail(f"no run {run_id!r} in {root}; `ragen runs --data-root {root}` lists the runs there")
    try:
        run_config = build_config(manifest["config"], list(ctx.args))
    except ConfigError as exc:
        _fail(str(exc))
    allowed = [key.strip() for key in force_config.split(",") if key.strip()]
    _run(run_config, root, run_id, verbose, allowed, skip_iteration)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def retrain(
    ctx: typer.Context,
    sql: str = typer.Option(
        ...,
        "--from",
        help="SQL selecting the trajectories (must return their key columns), "
        "e.g. \"SELECT * FROM trajectories WHERE run_id = 'r1' AND success\".",
    ),  # fmt: skip
    mode: str = typer.Option(
        "sft",
        "--mode",
        help="sft (cross-entropy on the replies) or pg (StarPO loss with "
        "importance weights from the stored behaviour log-probs).",
    ),  # fmt: skip
    init: str = typer.Option(
        ...,
        "--init",
        help="Model folder, checkpoint folder (its hf/ export), run:<id> (the "
        "model that run started from) or run:<id>@<updates> (its checkpoint).",
    ),  # fmt: skip
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config (actor, algorithm, offline, eval)."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Data root (default ./data or RAGEN_DATA_ROOT)."),
    run_id: str | None = typer.Option(None, "--run-id", help="Id of the new run (default retrain-<mode>-<hash>)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's and the libraries' logs."),
) -> None:
    """Re-train a model offline on stored trajectories, exactly as stored (no re-tokenisation), as a new run whose
    manifest records the query and the source runs. Extra key.sub=value overrides, e.g. offline.epochs=3."""
    from ragen_core.config import ConfigError, load_config

    if mode not in ("sft", "pg"):
        _fail(f"--mode must be sft or pg, not {mode!r}")
    try:
        run_config = load_config(config, list(ctx.args))
    except ConfigError as exc:
        _fail(str(exc))
    root = _existing_root(data_root)
    run_id = run_id or f"retrain-{mode}-{run_config.config_hash()[:8]}"
    _prepare_prefect(root, run_id, verbose)
    if not verbose:
        _quiet_libraries()
    from flows.retrain import retrain_offline
    from ragen_core.offline import OfflineError
    from ragen_core.session import RunExistsError

    console.print(f"offline {mode} run [bold]{run_id}[/] from {init} · data root {root}")
    try:
        result = retrain_offline(
            run_config.to_dict(), sql, mode, init, data_root=str(root), run_id=run_id,
            progress=lambda i, m: console.print(_metrics_line(i, m)),
        )  # fmt: skip
    except (OfflineError, RunExistsError) as exc:
        _fail(str(exc))
    console.print(f"trained on {result['trajectories']} stored trajectories")
    _print_run_summary(root, result["run_id"], None)


def _run(run_config, root: Path, run_id: str, verbose: bool, allowed: list[str], skip_iteration: bool) -> None:
    """Run (or resume) the train flow with a progress bar, then print the run's summary."""
    _prepare_prefect(root, run_id, verbose)
    if not verbose:
        _quiet_libraries()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows.train import train as train_flow
    from ragen_core.resume import ResumeError

    console.print(f"run [bold]{run_id}[/] · config {run_config.config_hash()} · data root {root}")
    total = run_config.trainer.iterations + 1
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("training", total=total)

        def on_iteration(iteration: int, metrics: dict[str, float]) -> None:
            progress.console.print(_metrics_line(iteration, metrics))
            progress.update(bar, completed=iteration + 1)

        try:
            result = train_flow(
                run_config.to_dict(),
                data_root=str(root),
                run_id=run_id,
                progress=on_iteration,
                force_config=allowed,
                skip_iteration=skip_iteration,
            )
        except ResumeError as exc:
            progress.stop()
            _fail(str(exc))
    if result.get("completed"):
        console.print(f"run {run_id} is already completed; nothing to do")
    elif result.get("resumed"):
        resumed = result["resumed"]
        console.print(
            f"resumed at iteration {resumed['next_iteration']} from "
            f"{resumed['checkpoint'] or 'the start model'} (replayed updates: {resumed['replayed'] or 'none'})"
        )
    _print_run_summary(root, result["run_id"], result.get("bootstrap"))


def _metrics_line(iteration: int, metrics: dict[str, float]) -> str:
    parts = [f"iter {iteration:>3}"]
    for key, label in (
        ("rollout/reward_mean", "reward"),
        ("rollout/success_rate", "success"),
        ("rollout/in_group_reward_std", "grp_std"),
        ("actor/pg_loss", "pg_loss"),
        ("actor/entropy", "entropy"),
        ("actor/grad_norm", "grad"),
    ):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.3f}")
    parts += [
        f"{k.removeprefix('val/')} {v:.3f}"
        for k, v in sorted(metrics.items())
        if k.startswith("val/") and k.endswith("/success")
    ]
    return " · ".join(parts)


def _print_run_summary(root: Path, run_id: str, bootstrap: dict | None) -> None:
    from ragen_core.storage import query

    success = query(
        root,
        f"SELECT iteration, name, value FROM metrics WHERE run_id = '{run_id}' AND name LIKE "
        "'val/%/success' ORDER BY iteration, name",
    ).to_pylist()
    if success:
        first, last = success[0]["iteration"], success[-1]["iteration"]
        console.print("\n[bold]validation success[/] (before RL -> after RL)")
        for name in sorted({row["name"] for row in success}):
            before = next(r["value"] for r in success if r["name"] == name and r["iteration"] == first)
            after = next(r["value"] for r in success if r["name"] == name and r["iteration"] == last)
            console.print(
                f"  {name.split('/')[1]:<16} iteration {first}: {before:.3f} -> iteration {last}: {after:.3f}"
            )
    if bootstrap:
        console.print(f"bootstrap: {bootstrap}")
    console.print("\n[bold]SQL summary[/]: " + SUMMARY_SQL.format(run_id=run_id))
    _print_table(query(root, SUMMARY_SQL.format(run_id=run_id)))


def _print_table(result, target: Console | None = None) -> None:
    table = Table(show_header=True, header_style="bold")
    for name in result.column_names:
        table.add_column(name)
    for row in result.to_pylist():
        table.add_row(*("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()))
    (target or console).print(table)


OUTPUT_FORMATS = ("table", "csv", "json", "parquet")
DATA_ROOT_HELP = "Data root (default ./data or RAGEN_DATA_ROOT)."


def _existing_root(data_root: Path | None) -> Path:
    root = _data_root(data_root)
    if not root.is_dir():
        _fail(f"data root {str(root)!r} does not exist; train first or pass --data-root")
    return root


def _check_output(output_format: str, out: Path | None, root: Path, formats: tuple[str, ...]) -> None:
    if output_format not in formats:
        _fail(f"--format must be one of {', '.join(formats)}, not {output_format!r}")
    if output_format == "parquet" and out is None:
        _fail("--format parquet writes a file: give it with --out FILE")
    if out is not None and out.resolve().is_relative_to(root):  # never write into the lake
        _fail(
            f"--out {str(out)!r} lies inside the data root {str(root)!r}; the lake is read-only here: write elsewhere"
        )


def _write_result(result, output_format: str, out: Path | None) -> None:
    """Write a query result as a rich table, CSV, JSON or Parquet, to ``out`` (atomically) or stdout."""
    import io

    from ragen_core.storage.files import atomic_write_bytes, atomic_write_parquet

    if output_format == "parquet":
        atomic_write_parquet(out, result)
        return
    if output_format == "table":
        buffer = io.StringIO()
        _print_table(result, Console(file=buffer, width=200, no_color=True) if out else console)
        data = buffer.getvalue().encode()
    elif output_format == "csv":
        import pyarrow.csv as pacsv

        sink = io.BytesIO()
        pacsv.write_csv(result, sink)
        data = sink.getvalue()
    else:
        data = (json.dumps(result.to_pylist(), default=str, indent=1) + "\n").encode()
    if out is not None:
        atomic_write_bytes(out, data)
    elif output_format != "table":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


@app.command()
def sql(
    statement: str = typer.Argument(..., help="One SQL query over the lake's tables (docs/sql.md)."),
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    run: str | None = typer.Option(None, "--run", help="Scope every table to this run id."),
    output_format: str = typer.Option("table", "--format", "-f", help="table, csv, json or parquet."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the result to FILE (required for parquet)."),
) -> None:
    """Run one read-only query over every run in the data root (in-process DuckDB over the Parquet tables)."""
    import duckdb

    from ragen_core.storage import DataLake, LakeError, QueryRefused, query
    from ragen_core.storage.housekeeping import runs_with_data

    root = _existing_root(data_root)
    _check_output(output_format, out, root, OUTPUT_FORMATS)
    lake = DataLake(root)
    if run is not None and run not in runs_with_data(lake):
        _fail(f"unknown run {run!r} in {root}; list the runs with `ragen runs`")
    try:
        result = query(lake, statement, run_id=run)
    except QueryRefused as exc:
        _fail(f"query refused: {exc}")
    except (duckdb.Error, LakeError) as exc:
        _fail(f"query failed: {exc}")
    _write_result(result, output_format, out)


runs_app = typer.Typer(help="List, remove and compact the runs of a data root.", add_completion=False)
app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    output_format: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
) -> None:
    """List the runs: status, config hash, committed iterations, last validation success, created_at."""
    ctx.obj = data_root
    if ctx.invoked_subcommand is not None:
        return
    from ragen_core.storage import DataLake, LakeError, runs_overview

    root = _existing_root(data_root)
    _check_output(output_format, None, root, OUTPUT_FORMATS[:3])
    try:
        overview = runs_overview(DataLake(root))
    except LakeError as exc:
        _fail(str(exc))
    if overview.num_rows == 0 and output_format == "table":
        console.print(f"no runs in {root}")
        return
    _write_result(overview, output_format, None)


@runs_app.command("rm")
def runs_rm(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help="The run to remove."),
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="Remove even when the manifest says 'running'."),
) -> None:
    """Remove a run: its rows in every table, staging, commits, quarantine, manifest, checkpoints, owned models."""
    from ragen_core.storage import DataLake, LakeError, plan_removal, remove_run

    root = _existing_root(data_root or ctx.obj)
    lake = DataLake(root)
    try:
        plan = plan_removal(lake, run_id, force=force)
    except LakeError as exc:
        _fail(str(exc))
    console.print(f"run [bold]{run_id}[/] (status {plan.status or 'no manifest'}) in {root}; this removes:")
    for line in plan.describe(root):
        console.print(f"  {line}")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if not yes and not typer.confirm("Remove it?", default=False):
        console.print("nothing removed")
        raise typer.Exit(code=1)
    try:
        remove_run(lake, plan)
    except LakeError as exc:
        _fail(str(exc))
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
    from ragen_core.storage import DataLake, LakeError, compact_run
    from ragen_core.storage.housekeeping import runs_with_data

    root = _existing_root(data_root or ctx.obj)
    lake = DataLake(root)
    if run_id not in runs_with_data(lake):
        _fail(f"unknown run {run_id!r} in {root}; list the runs with `ragen runs`")
    try:
        report = compact_run(lake, run_id, table or None)
    except LakeError as exc:
        _fail(str(exc))
    partitions = len(report.compacted)
    console.print(
        f"run {run_id}: merged {partitions} partition(s), {report.files_removed + partitions} files -> {partitions}"
    )
    if report.skipped_uncommitted:
        skipped = ", ".join(f"{t}/{i}" for t, i in report.skipped_uncommitted)
        console.print(f"left alone (iterations not committed yet): {skipped}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
