"""The commands that only read the data root: ``ragen sql`` (one query), ``ragen plot`` (a PNG of the runs'
collapse indicators) and ``ragen view`` (the rollout viewer). Each refuses a data root that does not exist and
writes nothing into it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from ragen_cli.common import (
    OUTPUT_FORMATS,
    DataRoot,
    check_output,
    checked_run_id,
    console,
    existing_root,
    fail,
    shown,
    warn,
    write_result,
)


def sql(
    statement: str | None = typer.Argument(
        None, help="One SQL query over the lake's tables (docs/sql.md); or --file.", show_default=False
    ),
    file: Path | None = typer.Option(None, "--file", help="Read the query from FILE (- for standard input)."),
    data_root: DataRoot = None,
    run: str | None = typer.Option(None, "--run", help="Scope every table to this run id."),
    output_format: str = typer.Option("table", "--format", "-f", help="table, csv, json or parquet."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the result to FILE (required for parquet)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --out FILE."),
) -> None:
    """Run one read-only query over every run in the data root (in-process DuckDB over the Parquet tables)."""
    import duckdb

    from ragen_core.storage import DataLake, LakeError, QueryRefused, query
    from ragen_core.storage.maintenance.housekeeping import runs_with_data

    checked_run_id(run)
    statement = _query_text(statement, file)
    named = _named_tables(statement, data_root)
    root = existing_root(data_root, store="read", tables=named)
    check_output(output_format, out, root, OUTPUT_FORMATS, force)
    lake = DataLake(root)
    if run is not None and run not in runs_with_data(lake):
        fail(f"unknown run {run!r} in {root}; list the runs with `ragen runs`")
    try:
        try:
            result = query(lake, statement, run_id=run, tables=None if named is None else tuple(named))
        except duckdb.CatalogException:
            if named is None:
                raise
            existing_root(data_root, store="read")  # a name the parse tree did not show: every table's rows
            result = query(lake, statement, run_id=run)
    except QueryRefused as exc:
        fail(f"query refused: {exc}")
    except (duckdb.Error, LakeError) as exc:
        fail(f"query failed: {exc}")
    write_result(result, output_format, out)


def _named_tables(statement: str, data_root: Path | None) -> frozenset[str] | None:
    """For a data root in a bucket, the lake's tables the query names (its local copy then gets those tables' rows
    alone: a query of ``metrics`` downloads no trajectory); None when the parse tree cannot tell, or for a folder."""
    from ragen_core.storage import QueryRefused
    from ragen_core.storage.objectstore import is_store_url
    from ragen_core.storage.statements import check_read_only, referenced_tables
    from schemas.tables import TABLES

    if not is_store_url(data_root if data_root is not None else os.environ.get("RAGEN_DATA_ROOT")):
        return None
    try:
        named = referenced_tables(check_read_only(statement))
    except QueryRefused as exc:
        fail(f"query refused: {exc}")
    return None if named is None else frozenset(named) & frozenset(TABLES)


def _query_text(statement: str | None, file: Path | None) -> str:
    """The query: the argument, or the text of ``--file`` (``-``: standard input); exactly one of them."""
    if (statement is None) == (file is None):
        fail(
            "give the query as the argument or with --file FILE, not both"
            if statement is not None
            else 'no query: give it as the argument (ragen sql "SELECT ...") or with --file FILE'
        )
    if file is None:
        return str(statement)
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read --file {str(file)!r}: {getattr(exc, 'strerror', None) or exc}")
    if not text.strip():
        fail(f"--file {str(file)!r} holds no query")
    return text


def plot(
    run_ids: list[str] = typer.Argument(..., help="One or several run ids (`ragen runs` lists them)."),
    out: Path = typer.Option(..., "--out", "-o", help="PNG file to write (outside the data root)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --out FILE."),
    data_root: DataRoot = None,
) -> None:
    """Plot the runs' collapse indicators from the metrics table into one PNG: validation success per env, reward
    mean and std, in-group reward std, entropy, gradient norm and response length against the iteration."""
    from ragen_core.monitor.plots import PlotError, plot_runs
    from ragen_core.storage import LakeError

    for run_id in run_ids:
        checked_run_id(run_id)
    root = existing_root(data_root, store="read")
    try:
        result = plot_runs(root, run_ids, out, force)
    except (PlotError, LakeError) as exc:
        fail(str(exc))
    except OSError as exc:  # the PNG cannot be written there: a user's mistake, not a traceback
        fail(f"cannot write --out {str(out)!r}: {exc.strerror or exc}")
    empty = [key for key, series in result.data.items() if not series]
    drawn = len(result.data) - len(empty) or len(result.data)
    console.print(f"wrote {shown(result.path)} ({drawn} panels; no data, not drawn: {', '.join(empty) or 'none'})")


def view(
    data_root: DataRoot = None,
    port: int = typer.Option(8765, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (beyond loopback: reachable from elsewhere)."
    ),
    open_browser: bool = typer.Option(
        None, "--open/--no-open", help="Open the URL in a browser (default: when this machine has a desktop)."
    ),
) -> None:
    """Serve a local web viewer of the data root: runs (curves, config diffs), iterations (groups, trajectories
    sorted and filtered, SQL WHERE included) and trajectories (the chat the model saw, each token coloured by loss
    mask, sampler log-prob or advantage; the env's grid). It reads the lake and writes nothing; Ctrl-C stops it. The
    URL it prints holds a token made at each start (open it as printed: a request without it is refused)."""
    from ragen_view.server import ViewError, bind, has_display, serve

    root = existing_root(data_root, store="read")
    try:
        binding = bind(host, port)
    except ViewError as exc:
        fail(str(exc))
    console.print(
        f"ragen view: {binding.url}  (data root {shown(root)}; Ctrl-C stops it)", highlight=False, soft_wrap=True
    )
    if not binding.loopback:
        warn(f"listening on {host}: anyone who can reach this machine and has the URL's token can read the lake")
    serve(root, binding, has_display() if open_browser is None else open_browser)


__all__ = ["plot", "sql", "view"]
