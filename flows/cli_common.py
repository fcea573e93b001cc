"""What the ``ragen`` commands share: the console, data-root resolution, errors, and result output."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 160)  # piped output: wide tables, not 80 columns
DEFAULT_DATA_ROOT = "data"


def data_root_path(value: Path | None) -> Path:
    return (value or Path(os.environ.get("RAGEN_DATA_ROOT", DEFAULT_DATA_ROOT))).resolve()


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


def print_table(result, target: Console | None = None) -> None:
    table = Table(show_header=True, header_style="bold")
    for name in result.column_names:
        table.add_column(name)
    for row in result.to_pylist():
        table.add_row(*("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()))
    (target or console).print(table)


OUTPUT_FORMATS = ("table", "csv", "json", "parquet")
DATA_ROOT_HELP = "Data root (default ./data or RAGEN_DATA_ROOT)."


def existing_root(data_root: Path | None) -> Path:
    root = data_root_path(data_root)
    if not root.is_dir():
        fail(f"data root {str(root)!r} does not exist; train first or pass --data-root")
    return root


def check_output(output_format: str, out: Path | None, root: Path, formats: tuple[str, ...]) -> None:
    if output_format not in formats:
        fail(f"--format must be one of {', '.join(formats)}, not {output_format!r}")
    if output_format == "parquet" and out is None:
        fail("--format parquet writes a file: give it with --out FILE")
    if out is not None and out.resolve().is_relative_to(root):  # never write into the lake
        fail(
            f"--out {str(out)!r} lies inside the data root {str(root)!r}; the lake is read-only here: write elsewhere"
        )


def write_result(result, output_format: str, out: Path | None) -> None:
    """Write a query result as a rich table, CSV, JSON or Parquet, to ``out`` (atomically) or stdout."""
    import io

    from ragen_core.storage.files import atomic_write_bytes, atomic_write_parquet

    if output_format == "parquet":
        atomic_write_parquet(out, result)
        return
    if output_format == "table":
        buffer = io.StringIO()
        print_table(result, Console(file=buffer, width=200, no_color=True) if out else console)
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
