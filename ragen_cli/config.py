"""``ragen config show``: every config key with its value, its default and its description."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from ragen_cli.common import OUTPUT_FORMATS, OVERRIDES, config_option, fail, load_config_or_fail, write_result

config_app = typer.Typer(help="Show the config's keys.", add_completion=False, no_args_is_help=True)


@config_app.command("show", context_settings=OVERRIDES)
def show(
    ctx: typer.Context,
    config: Path | None = config_option("YAML config (default: the defaults)."),
    output_format: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
) -> None:
    """Every key of the config (dotted, as overrides name it) with its value, its default and its description.
    Extra key.sub=value overrides are applied first, e.g. algorithm.preset=starpo. Reads no data root."""
    from ragen_core.config.describe import describe_keys

    if output_format not in OUTPUT_FORMATS[:3]:
        fail(f"--format must be one of {', '.join(OUTPUT_FORMATS[:3])}, not {output_format!r}")
    keys = describe_keys(load_config_or_fail(config, ctx.args))
    if output_format == "json":  # the values keep their JSON types
        rows = [{"key": k.key, "value": k.value, "default": k.default, "description": k.description} for k in keys]
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    import pyarrow as pa

    columns = {
        "key": [k.key for k in keys],
        "value": [as_text(k.value) for k in keys],
        "default": [as_text(k.default) for k in keys],
        "description": [k.description for k in keys],
    }
    write_result(pa.table(columns), output_format, None)


def as_text(value: Any) -> str:
    """A value as an override would write it: text as is (an empty text as ``""``), anything else as JSON (``null``,
    ``true``, ``[1, 2]``), which YAML reads back as the same value."""
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value)
