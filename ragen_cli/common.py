"""What the ``ragen`` commands share: the consoles, data-root resolution, errors, and result output.

Results go to stdout (``console``); errors and warnings to stderr (``err_console``), so ``ragen sql ... -f csv > f``
never writes an error into ``f``. Text from the lake or from users (cells, paths, ids) is shown literally: table cells
are :class:`rich.text.Text` and interpolated values are markup-escaped, so ``[red]`` stays visible and ``[/x]`` cannot
break the output.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

# emoji=False: text from users (paths, run:<id>: in messages) is shown as typed, never as emoji (':ab:' is one).
# Piped output (a file, grep): tables 160 columns wide, and a line of text never wrapped (soft_wrap), whatever its
# length, so that a grep for an iteration's line finds all of it.
console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=not sys.stdout.isatty(), emoji=False)
err_console = Console(
    stderr=True, width=None if sys.stderr.isatty() else 160, soft_wrap=not sys.stderr.isatty(), emoji=False
)
DEFAULT_DATA_ROOT = "data"


def fail(message: str) -> None:
    """Print ``error: message`` (literally, in one line: :func:`one_line`) on stderr and exit with status 2: a user's
    mistake, no traceback. After a stop signal the failure is the stop's doing (a library that was interrupted wraps
    the KeyboardInterrupt in its own error, as DuckDB does): the command then says only that it was interrupted, with
    the signal's exit status."""
    from ragen_cli import interrupts

    if interrupts.requested():
        interrupts.report(f"interrupted ({interrupts.signal_name()})")
        raise typer.Exit(code=interrupts.exit_code())
    say("error", message)
    raise typer.Exit(code=2)


STYLES = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def say(label: str, message: str) -> None:
    """Print ``label: message`` (``label`` one of :data:`STYLES`; the message literally, in one line:
    :func:`one_line`) on stderr."""
    err_console.print(
        Text.assemble((f"{label}:", STYLES[label]), " ", one_line(message)), highlight=False, soft_wrap=True
    )


def warn(message: str) -> None:
    """Print ``warning: message`` (literally, in one line) on stderr."""
    say("warning", message)


def note(message: str) -> None:
    """Print ``note: message`` (literally, in one line) on stderr: what a command is about to do that the user may
    not have meant."""
    say("note", message)


def one_line(message: str) -> str:
    """``message`` as one terminal-safe line (:func:`ragen_core.storage.statements.one_line`), every control
    character written as an escape (:func:`printable`)."""
    from ragen_core.storage.statements import one_line as joined

    return printable(joined(message))


def data_root_path(value: Path | None, store: str | None = None, tables: frozenset[str] | None = None) -> Path:
    """The data root (``--data-root``, else ``RAGEN_DATA_ROOT``, else ``./data``), absolute; a file there is an
    error. An object-store root (``s3://bucket/prefix``) is opened as its local copy
    (:func:`ragen_core.storage.storecopy.open_store_root`) for a command that says it works there: ``store`` is
    ``"write"`` (the copy gets what a run needs), ``"read"`` (what the tables need; with ``tables``, the rows of
    those alone) or ``"all"`` (everything: other runs' checkpoints too); else it is refused in one line."""
    from ragen_core.storage.objectstore import is_store_url

    given = value if value is not None else os.environ.get("RAGEN_DATA_ROOT", DEFAULT_DATA_ROOT)
    if is_store_url(given):
        return store_root_path(str(given), store, tables)
    root = Path(given).resolve()
    if root.exists() and not root.is_dir():
        fail(f"data root {str(root)!r} is a file, not a folder; name a folder as the data root")
    return root


def store_root_path(url: str, store: str | None, tables: frozenset[str] | None = None) -> Path:
    """The local copy of an object-store data root, brought up to date (see :func:`data_root_path`)."""
    from ragen_core.storage.files import LakeError
    from ragen_core.storage.storecopy import open_store_root

    if store is None:
        fail(
            f"this command does not work on a data root in an object store ({url}); work on a local copy instead "
            "(`aws s3 sync` it into a folder and pass that folder)"
        )
    try:
        return open_store_root(url, only=None if store == "all" else store, tables=tables)
    except LakeError as exc:
        fail(str(exc))
    raise AssertionError("unreachable")


def writable_root(value: Path | None, create: bool = True) -> Path:
    """The data root of a command that writes: created when missing (``create``), and proven writable before any
    compute is spent (:func:`ragen_core.run.requests.writable_lake`, the request builders' own check)."""
    from ragen_core.run.requests import RequestError, writable_lake

    root = data_root_path(value)
    try:
        writable_lake(root, create)
    except RequestError as exc:
        fail(str(exc))
    return root


def printable(text: str) -> str:
    """``text`` with every terminal control character (ESC, BEL, CR, ...) but tab and newline (a table cell may hold
    lines) written as a ``\\xNN`` escape, so stored or generated text (chr(27) || '[2J') cannot clear the screen or
    move the cursor."""
    from ragen_core.monitor.reports import escape_controls

    return escape_controls(text, keep="\t\n")


def shown(value: object) -> str:
    """``value`` as text to put into a rich markup line: one line (every control character, newline included,
    escaped) whose ``[...]`` is shown, never read as markup (a path, a model folder, a lock holder's command)."""
    from rich.markup import escape

    from ragen_core.monitor.reports import escape_controls

    return escape(escape_controls(str(value)))


def _cell(value) -> Text:
    """One table cell, shown literally (never parsed as rich markup, no control character reaching the terminal)."""
    if value is None:
        return Text("")
    return Text(printable(f"{value:.6g}" if isinstance(value, float) else str(value)))


def print_table(result, target: Console | None = None) -> None:
    """Print an Arrow table as a rich table; every header and cell is literal text, shown whole: a cell too wide for
    the terminal folds onto more lines instead of ending in an ellipsis (overrides are read in full), and ids
    (``run_id``, ``sweep_id``, ...) keep one line where the terminal is wide enough for them, so that a copied id is
    whole."""
    target = target or console
    table = Table(show_header=True, header_style="bold")
    rows = result.to_pylist()
    names = result.column_names
    ids = {
        name: max([len(printable(str(row[name]))) for row in rows if row[name] is not None] + [len(name)])
        for name in names
        if name == "id" or name.endswith("_id")
    }
    # ids keep one line (copied whole) when they fit beside a narrow share (8) of every other column; else all fold
    fits = sum(ids.values()) + 3 * len(names) + 1 + 8 * (len(names) - len(ids)) <= target.width
    for name in names:
        if name in ids and fits:
            table.add_column(Text(printable(name)), overflow="fold", no_wrap=True, min_width=ids[name])
        else:
            table.add_column(Text(printable(name)), overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    target.print(table)


OUTPUT_FORMATS = ("table", "csv", "json", "parquet")
DATA_ROOT_HELP = "Data root (default ./data or RAGEN_DATA_ROOT)."


def existing_root(data_root: Path | None, store: str | None = None, tables: frozenset[str] | None = None) -> Path:
    """The data root of a command that only reads: it must exist (``store``; ``tables``, the only tables whose rows
    a bucket's copy gets: see :func:`data_root_path`)."""
    root = data_root_path(data_root, store, tables)
    if not root.is_dir():
        fail(f"data root {str(root)!r} does not exist; train first or pass --data-root")
    return root


def check_output(
    output_format: str, out: Path | None, root: Path, formats: tuple[str, ...], force: bool = False
) -> None:
    """Refuse a bad ``--format`` / ``--out`` before any work: parquet without a file, a file inside the data root,
    a folder, or an existing file without ``--force``."""
    if output_format not in formats:
        fail(f"--format must be one of {', '.join(formats)}, not {output_format!r}")
    if output_format == "parquet" and out is None:
        fail("--format parquet writes a file: give it with --out FILE")
    if out is None:
        return
    if out.is_symlink():  # replacing the link would lose it; writing through it would write elsewhere
        fail(f"--out {str(out)!r} is a symbolic link; give the path of a plain file")
    if out.resolve().is_relative_to(root):  # never write into the lake
        fail(
            f"--out {str(out)!r} lies inside the data root {str(root)!r}; the lake is read-only here: write elsewhere"
        )
    if out.is_dir():
        fail(f"--out {str(out)!r} is a folder; give a file name, e.g. {str(out / ('result.' + output_format))!r}")
    if out.exists() and not out.is_file():  # a FIFO, a device, a socket: --force would replace it with a file
        fail(f"--out {str(out)!r} is not a plain file (a device, pipe or socket); write to a file")
    if out.exists() and not force:
        fail(f"--out {str(out)!r} exists; pass --force to overwrite it")


def write_result(result, output_format: str, out: Path | None) -> None:
    """Write a query result as a rich table, CSV, JSON or Parquet, to ``out`` (atomically) or stdout."""
    import io

    if output_format == "parquet":
        _write_file(out, result)
        return
    if output_format == "table":
        buffer = io.StringIO()
        print_table(result, Console(file=buffer, width=200, no_color=True) if out else console)
        data = buffer.getvalue().encode()
    elif output_format == "csv":
        import pyarrow.csv as pacsv

        sink = io.BytesIO()
        pacsv.write_csv(_csv_ready(result), sink)
        data = sink.getvalue()
    else:
        data = (json.dumps(result.to_pylist(), default=str, indent=1) + "\n").encode()
    if out is not None:
        _write_file(out, data)
    elif output_format != "table":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def _csv_ready(result):
    """``result`` with every nested column (lists, structs, maps: CSV has no such cells) as one JSON text per cell."""
    import pyarrow as pa

    columns = []
    for column in result.columns:
        if pa.types.is_nested(column.type):
            cells = [None if v is None else json.dumps(v, default=str) for v in column.to_pylist()]
            column = pa.array(cells, pa.string())
        columns.append(column)
    return pa.table(columns, names=result.column_names)


def checked_run_id(run_id: str | None, what: str = "run id") -> str | None:
    """``run_id`` (None stays None) when it is a plain name (:mod:`ragen_core.storage.names`); else a user error,
    raised before anything is read or created."""
    from ragen_core.storage.names import InvalidRunIdError, validate_run_id

    if run_id is None:
        return None
    try:
        return validate_run_id(run_id, what)
    except InvalidRunIdError as exc:
        fail(str(exc))


def _write_file(out: Path, data) -> None:
    """Write bytes or an Arrow table to ``out`` atomically; a file system refusal is a user error, not a traceback."""
    from ragen_core.storage.files import atomic_write_bytes, atomic_write_parquet

    try:
        if isinstance(data, bytes):
            atomic_write_bytes(out, data)
        else:
            atomic_write_parquet(out, data)
    except OSError as exc:
        fail(f"cannot write --out {str(out)!r}: {exc.strerror or exc}")


# -- options shared by commands: declared once ------------------------------------------------------------------
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": False}  # commands taking key.sub=value overrides
DataRoot = Annotated[Path | None, typer.Option("--data-root", help=DATA_ROOT_HELP)]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show Prefect's and the libraries' logs.")]


def config_option(help_text: str = "YAML config file.") -> Any:
    """``--config / -c``: a YAML config file (what it is the base of differs per command)."""
    return typer.Option(None, "--config", "-c", help=help_text)


def run_id_option(help_text: str) -> Any:
    """``--run-id``: the id of the run a command creates (its default differs per command)."""
    return typer.Option(None, "--run-id", help=help_text)


TrustEnvModule = Annotated[
    bool,
    typer.Option(
        "--trust-env-module",
        help="Import the modules the stored config names (env.name / env.val_envs as package.module:Class, "
        "env.options.reward_fn) without naming them again (docs/security.md).",
    ),
]


def load_config_or_fail(config: Path | None, overrides: list[str]) -> Any:
    """The validated config of a YAML file (or the defaults) plus ``key.sub=value`` overrides; a bad one is a user
    error (one line, exit status 2), before anything starts."""
    from ragen_core.config import ConfigError
    from ragen_core.run.checks import load_run_config

    try:
        return load_run_config(config, list(overrides))
    except ConfigError as exc:
        fail(str(exc))
