"""A Hugging Face ``datasets`` folder of chosen runs' rows (``ragen export``): read-only on the lake.

One table gives a folder that ``load_dataset("parquet", data_dir=OUT)`` loads with two splits::

    OUT/train/part-<k>.parquet         the rows with split = 'train' of run k (the runs in the order given)
    OUT/validation/part-<k>.parquet    the rows with split = 'val'
    OUT/README.md                      what was exported: runs, tables, rows per split, and the line to load it

Several tables give one such folder per table (``OUT/<table>/``: ``data_dir=OUT/<table>``), since one dataset has
one schema. The names hold no split word besides the split folders (``datasets`` picks splits by the words in
folder and file names). A run without rows of a split has no file in it (``datasets`` cannot load a 0-row Parquet
file), so a split no run has rows of is left out, and the report says so (0 rows). Rows are the lake's readers'
(:meth:`DataLake.read_table`: the current schema, compacted partitions once, only the parts the lake published), of
the iterations each run had committed when the export began: a run still training (or stopped mid-iteration) has
published rows of an iteration it has not committed, which a resume discards and redoes, so they are left out and
the report names them (:attr:`ExportReport.left_out`); a run without a committed iteration is refused.
Everything is written into a hidden folder beside ``OUT``, which is renamed to ``OUT`` last: a failed export leaves
nothing.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ragen_core.storage.files import LakeError, atomic_write_bytes, atomic_write_parquet
from ragen_core.storage.lake import DataLake
from ragen_core.storage.layout import CHECKPOINT_ADAPTER, CHECKPOINT_HF, checkpoint_file
from ragen_core.storage.names import validate_run_id

SPLITS = {"train": "train", "validation": "val"}  # the dataset's split: the lake's `split` value
EXPORT_TMP_PREFIX = ".ragen-export-"


class ExportError(LakeError):
    """An export that cannot be done as asked: the message says what is wrong and how to fix it."""


@dataclass
class ExportReport:
    """What :func:`export_dataset` wrote: rows per (table, split) and the folder of each table's dataset."""

    out: Path
    runs: list[str]
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    folders: dict[str, Path] = field(default_factory=dict)
    committed: dict[str, list[int]] = field(default_factory=dict)  # the iterations exported, per run
    left_out: dict[str, list[int]] = field(default_factory=dict)  # iterations with rows but not committed, per run
    # each run's policy (its newest checkpoint's Hugging Face folder): where it was copied in the export with
    # --model, else where it lies in the data root; a run without a checkpoint has none
    models: dict[str, Path] = field(default_factory=dict)
    models_copied: bool = False
    # the runs whose chat the README leaves out (a stored config naming code or files from outside), each with the
    # reason and what makes the export write it
    chats_left_out: dict[str, str] = field(default_factory=dict)


EXPORT_MODELS = "models"  # the export's folder of each run's policy (--model): models/<run id>/


def exported_model_dir(run_id: str) -> Path:
    """Where ``--model`` puts a run's policy, relative to the export's folder."""
    return Path(EXPORT_MODELS) / run_id


def policy_folders(lake: DataLake, run_ids: list[str]) -> dict[str, Path]:
    """Each run's policy: the Hugging Face folder of its newest complete checkpoint, or its LoRA adapters' folder
    (``adapter/``, for a run trained with ``actor.lora``); runs without a checkpoint left out."""
    found = {}
    for run_id in dict.fromkeys(run_ids):
        newest = lake.latest_checkpoint(run_id)
        for kind in (CHECKPOINT_HF, CHECKPOINT_ADAPTER):
            if newest is not None and checkpoint_file(newest[1], kind).is_dir():
                found[run_id] = checkpoint_file(newest[1], kind)
    return found


def adapter_runs(lake: DataLake, run_ids: list[str]) -> list[str]:
    """The runs whose newest complete checkpoint holds LoRA adapters (``adapter/``) in place of a Hugging Face
    export."""
    newest = {run_id: lake.latest_checkpoint(run_id) for run_id in dict.fromkeys(run_ids)}
    return [run for run, found in newest.items() if found and checkpoint_file(found[1], CHECKPOINT_ADAPTER).is_dir()]


def _copy_policy(source: Path, target: Path) -> None:
    """The regular files of ``source`` (a policy folder of the lake) copied to ``target``; a link in it (which could
    point anywhere) is refused, naming it, rather than followed."""
    for path in sorted(source.rglob("*")):
        if path.is_symlink():
            raise ExportError(
                f"the policy folder {str(source)!r} holds a link, {str(path)!r}: not exported; remove it"
            )
        if path.is_file():
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


def splittable_tables(lake: DataLake) -> list[str]:
    """The tables an export can write: Parquet tables with a ``split`` column."""
    return [n for n, s in lake.tables.items() if s.source == "parquet" and "split" in s.column_names]


def check_export(lake: DataLake, out: Path, run_ids: list[str], tables: list[str]) -> None:
    """Refuse a bad export before anything is written: no or unknown runs, unknown or unsplittable tables, an
    ``out`` that is inside the data root, a link, a file or a non-empty folder."""
    if not run_ids:
        raise ExportError("name at least one run to export (`ragen runs` lists them)")
    from ragen_core.storage.maintenance.housekeeping import runs_with_data

    known = runs_with_data(lake)
    for run_id in run_ids:
        validate_run_id(run_id)
        if run_id not in known:
            raise ExportError(f"unknown run {run_id!r} in {lake.root}; list the runs with `ragen runs`")
    allowed = splittable_tables(lake)
    for table in tables:
        if table not in allowed:
            raise ExportError(
                f"cannot export table {table!r}: an export takes a table with train and validation "
                f"rows ({', '.join(allowed)})"
            )
    if len(set(run_ids)) != len(run_ids) or len(set(tables)) != len(tables) or not tables:
        raise ExportError("name each run and each table once (and at least one table)")
    if os.path.islink(out):
        raise ExportError(f"--out {str(out)!r} is a symbolic link; give the path of a new folder")
    if out.resolve().is_relative_to(lake.root):
        raise ExportError(
            f"--out {str(out)!r} lies inside the data root {str(lake.root)!r}; the lake is read-only "
            "here: export elsewhere"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {str(out)!r} exists and is not an empty folder; give a new folder")
    if not out.resolve().parent.is_dir():
        raise ExportError(f"the folder of --out {str(out)!r} does not exist; create it first")


def export_dataset(
    lake: DataLake,
    out: Path,
    run_ids: list[str],
    tables: list[str],
    notes: str = "",
    models: bool = False,
    policies: dict[str, Path] | None = None,
) -> ExportReport:
    """Write the dataset folder (module docstring) of ``run_ids``' rows of ``tables`` at ``out``; ``notes``: more
    markdown for its README (how to prompt each run's policy: :func:`ragen_core.run.chat.export_notes`); with
    ``models``, each run's policy (``policies``, default :func:`policy_folders`) copied to ``models/<run id>/`` in
    it."""
    check_export(lake, out, run_ids, tables)
    out = out.resolve()
    report = ExportReport(out, list(run_ids), committed=committed_iterations(lake, run_ids))
    report.models = policy_folders(lake, run_ids) if policies is None else dict(policies)
    report.models_copied = models
    staging: Path | None = None
    identity: tuple[int, int] | None = None
    try:
        # created exclusively under a name nobody can predict, readable by this user only while it fills: a link or
        # folder planted beside --out is never written through, nor taken for ours
        staging = Path(tempfile.mkdtemp(prefix=f"{EXPORT_TMP_PREFIX}{out.name}-", dir=out.parent))
        identity = _identity(staging)
        for table in tables:
            folder = staging / table if len(tables) > 1 else staging
            report.rows[table] = _write_table(lake, table, report, folder)
            report.folders[table] = out / table if len(tables) > 1 else out
        if models:
            for run_id, source in report.models.items():
                _copy_policy(source, staging / exported_model_dir(run_id))
            report.models = {run_id: out / exported_model_dir(run_id) for run_id in report.models}
        atomic_write_bytes(staging / "README.md", (_card(lake, report) + notes).encode())
        if _identity(staging) != identity:
            raise ExportError(
                f"the export's staging folder {str(staging)!r} was replaced while it was written (by a "
                "link or another folder); nothing was exported: export again"
            )
        os.chmod(staging, 0o777 & ~_umask())  # the finished folder as any folder this user makes
        if out.exists():
            out.rmdir()  # empty (checked): replaced by the finished export
        os.replace(staging, out)
        staging = None
    except OSError as exc:
        raise ExportError(
            f"cannot write the export to {str(out)!r}: {exc.strerror or exc}; nothing was written there"
        ) from exc
    finally:
        if staging is not None and _identity(staging) == identity:  # still the folder made here (never a link)
            shutil.rmtree(staging, ignore_errors=True)
    return report


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of ``folder`` itself when it is a real folder (not a link); None otherwise."""
    try:
        info = os.lstat(folder)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def _umask() -> int:
    """This process's file-mode creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def committed_iterations(lake: DataLake, run_ids: list[str]) -> dict[str, list[int]]:
    """The iterations each run has committed now (what an export takes); a run without one is refused."""
    committed = {run_id: lake.committed_iterations(run_id) for run_id in run_ids}
    for run_id, iterations in committed.items():
        if not iterations:
            raise ExportError(
                f"run {run_id!r} has no committed iteration yet (it is in its first one, or stopped "
                "there): nothing of it is final; export it once it has committed one"
            )
    return committed


def _write_table(lake: DataLake, table: str, report: ExportReport, folder: Path) -> dict[str, int]:
    """One table's splits, one file per run and split, of the run's committed iterations; the rows written per
    split (the iterations left out are added to ``report.left_out``)."""
    rows = dict.fromkeys(SPLITS, 0)
    for index, run_id in enumerate(report.runs):
        data = lake.read_table(table, run_id)
        committed = pc.is_in(data["iteration"], pa.array(report.committed[run_id], data["iteration"].type))
        left_out = set(pc.unique(data.filter(pc.invert(committed))["iteration"]).to_pylist())
        report.left_out[run_id] = sorted(left_out | set(report.left_out.get(run_id, [])))
        data = data.filter(committed)
        for split, value in SPLITS.items():
            part = data.filter(pc.equal(data["split"], pa.scalar(value)))
            if part.num_rows:
                atomic_write_parquet(folder / split / _part_name(index), part)
            rows[split] += part.num_rows
    return rows


def load_line(folder: Path) -> str:
    """The one line that loads an exported table. ``datasets`` expands ``*``, ``?`` and ``[...]`` in ``data_dir``, so
    the folder is named with them escaped: ``out[1]`` would load a sibling ``out1``."""
    return f'load_dataset("parquet", data_dir="{glob.escape(str(folder))}")'


def _card(lake: DataLake, report: ExportReport) -> str:
    """README.md of the export: where it came from and how to load it."""
    lines = ["# RAGEN-Flows export", "", f"From data root `{lake.root}`, runs: {', '.join(report.runs)}.", ""]
    for run_id in report.runs:
        lines += [
            f"- `{run_id}`: committed iterations {_spans(report.committed[run_id])}"
            + (
                f" (left out, not committed then: {_spans(report.left_out[run_id])})"
                if report.left_out.get(run_id)
                else ""
            )
        ]
    lines += [""]
    for table, counts in report.rows.items():
        shown = ", ".join(f"{split} {n}" for split, n in counts.items())
        lines += [f"- `{table}` ({shown} rows): `{load_line(report.folders[table])}`"]
    lines += ["", "Columns: docs/sql.md of ragen-flows. `validation` holds the rows with split = 'val'.", ""]
    return "\n".join(lines)


def _part_name(index: int) -> str:
    """An exported part file's name (a file of the export's folder, outside the data root)."""
    return f"part-{index:05d}.parquet"


def _spans(iterations: list[int]) -> str:
    """``0-3, 5`` for [0, 1, 2, 3, 5]."""
    spans: list[list[int]] = []
    for i in iterations:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def left_out_line(report: ExportReport) -> str | None:
    """A line naming the iterations left out (rows not committed when the export began), or None."""
    parts = [f"{run_id} iteration(s) {_spans(its)}" for run_id, its in report.left_out.items() if its]
    if not parts:
        return None
    return f"left out, not committed yet (a run still training or stopped mid-iteration): {'; '.join(parts)}"
