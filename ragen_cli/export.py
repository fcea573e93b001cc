"""``ragen export`` (chosen runs' rows as a Hugging Face ``datasets`` folder) and ``ragen upgrade-lake`` (a data
root of an older lake layout brought to the current one); both registered in :mod:`ragen_cli.main`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from ragen_cli.common import DATA_ROOT_HELP, TrustEnvModule, checked_run_id, console, existing_root, fail


def export(
    run_ids: list[str] = typer.Argument(..., help="The run(s) to export (`ragen runs` lists them)."),
    out: Path = typer.Option(..., "--out", "-o", help="A new (or empty) folder outside the data root."),
    table: list[str] | None = typer.Option(
        None, "--table", help="trajectories (default) or turns; repeatable (then one folder per table)."
    ),
    data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP),
    trust_env_module: TrustEnvModule = False,
    model: bool = typer.Option(
        False,
        "--model",
        help="Copy each run's policy (its newest checkpoint's Hugging Face folder, or a LoRA run's adapters) to "
        "OUT/models/<run>.",
    ),
    merge: bool = typer.Option(
        False,
        "--merge",
        help="With --model: a LoRA run's adapters merged into its start model, a whole Hugging Face folder.",
    ),
) -> None:
    """Write runs' rows as a dataset folder with train and validation splits: load_dataset("parquet",
    data_dir=OUT) loads it (several --table: data_dir=OUT/<table>). Reads the lake only."""
    from ragen_core.api import export as export_runs
    from ragen_core.config import ConfigError
    from ragen_core.storage import LakeError
    from ragen_core.storage.maintenance.export import left_out_line, load_line

    for run_id in run_ids:
        checked_run_id(run_id)
    root = existing_root(data_root, store="all")
    try:
        report = export_runs(list(run_ids), out, root, table, trust_env_module, model, merge)  # checked first
    except (LakeError, ConfigError) as exc:
        fail(str(exc))
    for name, rows in report.rows.items():
        counts = ", ".join(f"{split} {n}" for split, n in rows.items())
        console.print(f"{escape(name)}: {counts} rows -> {escape(load_line(report.folders[name]))}", highlight=False)
    if line := left_out_line(report):
        console.print(escape(line), highlight=False)
    for run_id in report.runs:
        policy = report.models.get(run_id)
        where = "none (no checkpoint)" if policy is None else str(policy)
        hint = "" if policy is None or report.models_copied else " (not copied: --model copies it into the export)"
        console.print(f"policy of {escape(run_id)}: {escape(where)}{hint}", highlight=False)
    for run_id, reason in report.chats_left_out.items():
        console.print(f"README.md leaves out the chat of {escape(run_id)}: {escape(reason)}", highlight=False)
    console.print(
        f"how to prompt each run's policy (system prompt, messages, a transformers snippet): "
        f"{escape(str(report.out / 'README.md'))}",
        highlight=False,
    )


def upgrade_lake(data_root: Path | None = typer.Option(None, "--data-root", help=DATA_ROOT_HELP)) -> None:
    """Bring a data root written by an older ragen-flows to the current lake layout (folders and part-file names,
    no file rewritten); safe to interrupt and run again. Stop the runs writing to it first."""
    from ragen_core.storage import DataLake, LakeError
    from ragen_core.storage.maintenance.upgrade import upgrade_layout
    from ragen_core.storage.storecopy import root_address

    root = existing_root(data_root, store="all")
    shown_root = root_address(root)
    try:
        report = upgrade_layout(DataLake(root))
    except LakeError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(
            f"cannot upgrade {shown_root!r}: {exc.strerror or exc} ({exc.filename}); make it writable, then run "
            "`ragen upgrade-lake` again (it goes on where it stopped)"
        )
    if report.recorded:
        console.print(
            f"recorded the published parts of {report.recorded} partition(s) written before such records were kept",
            highlight=False,
        )
    if not report.partitions:
        console.print(f"{escape(shown_root)} already has lake layout {report.layout}", highlight=False)
        return
    console.print(
        f"upgraded {escape(shown_root)} to lake layout {report.layout}: {len(report.partitions)} partition(s), "
        f"{report.files} file(s), runs {escape(', '.join(report.runs))}",
        highlight=False,
    )
