"""The ``ragen`` command line: train, sql."""

from __future__ import annotations

import json
import os
import sys
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
    of the run's own when no server is configured (two runs never share one SQLite file)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if "PREFECT_API_URL" not in os.environ and "PREFECT_HOME" not in os.environ:
        home = data_root / "_prefect" / run_id
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
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default <env>-<hash>-<time>)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's and the libraries' logs."),
) -> None:
    """Train with StarPO / StarPO-S. Extra arguments are key.sub=value overrides, e.g. trainer.iterations=5."""
    from ragen_core.config import ConfigError, load_config

    try:
        run_config = load_config(config, list(ctx.args))
    except ConfigError as exc:
        _fail(str(exc))
    root = _data_root(data_root)
    from flows.train import default_run_id
    from ragen_core.session import RunExistsError, check_run_id_free
    from ragen_core.storage import DataLake

    run_id = run_id or default_run_id(run_config)
    try:
        check_run_id_free(DataLake(root), run_id)
    except RunExistsError as exc:
        _fail(str(exc))
    _prepare_prefect(root, run_id, verbose)
    if not verbose:
        _quiet_libraries()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows.train import train as train_flow

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
            progress.advance(bar)

        result = train_flow(run_config.to_dict(), data_root=str(root), run_id=run_id, progress=on_iteration)
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


def _print_table(result) -> None:
    table = Table(show_header=True, header_style="bold")
    for name in result.column_names:
        table.add_column(name)
    for row in result.to_pylist():
        table.add_row(*("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)


@app.command()
def sql(
    statement: str = typer.Argument(..., help="SQL over the tables trajectories, turns, metrics."),
    data_root: Path | None = typer.Option(None, "--data-root", help="Data root (default ./data or RAGEN_DATA_ROOT)."),
    output_format: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
) -> None:
    """Run SQL over every run in the data root (in-process DuckDB over the Parquet tables)."""
    import duckdb

    from ragen_core.storage import LakeError, query

    if output_format not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, not {output_format!r}")
    root = _data_root(data_root)
    if not root.is_dir():
        _fail(f"data root {str(root)!r} does not exist; train first or pass --data-root")
    try:
        result = query(root, statement)
    except (duckdb.Error, LakeError) as exc:
        _fail(f"query failed: {exc}")
    if output_format == "table":
        _print_table(result)
    elif output_format == "csv":
        import pyarrow.csv as pacsv

        sink = sys.stdout.buffer
        pacsv.write_csv(result, sink)
        sink.flush()
    else:
        typer.echo(json.dumps(result.to_pylist(), default=str, indent=1))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
