"""Re-stamping the committed findings: evidence that a code change moves none of their numbers, bought cheaply.

A finding's JSON names the code fingerprint that made its numbers. When the counted code changes, the numbers are
either made again (``ragen reproduce --all``, hours) or the change is *probed*: both checkouts, the commit that made
the numbers and the new one, run the first few iterations of every point of every finding on this machine, one
after the other on the same data-root path, and every row they write is compared bit for bit. A probe that finds
every row and every analysis number equal, every changed counted file executed, and every finding's spec, config and
defaults unchanged writes a record under ``docs/findings/restamps/``; the digest test accepts a finding whose
fingerprint reaches the checkout's through a chain of such records. Nothing here decides a number: the module is
plumbing (:data:`ragen_core.findings.provenance.PLUMBING`).

Why the same machine: bitwise equality holds per CPU kind (the kernels torch picks differ between AVX2 and AVX-512
machines), so a probe compares two codes, never two machines.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from ragen_core.findings.provenance import PLUMBING, code_fingerprint, code_form, library_versions

RECORDS = Path("docs") / "findings" / "restamps"  # the records, relative to the repository's root

# The one declared list of what may differ between two runs that computed the same numbers: wall-clock times, the
# rates derived from them and the moments rows were written. Nothing else is ever excluded from a comparison.
TIMING_METRICS = ("time/",)  # metric-name prefixes (the metrics table): stage seconds and tokens per second
TIMING_COLUMNS = {"events": ("created_at",)}  # per table: columns holding a moment of writing
TIMING_NUMBERS = re.compile(r"(^|/|_)(seconds|minutes|per_minute)(_|$)|^time/")  # analysis keys (filtering, diversity)

# The tables compared row by row, each by its key (schemas/tables.py): what a finding's numbers are made from.
TABLES = ("metrics", "trajectories", "turns", "events", "evaluations")

# The probe's settings on top of each finding's own ``quick`` overrides: every point (the spec's seeds, not quick's),
# the bootstrap on but short, so that each point bootstraps, validates and updates at least once.
PROBE_DROP = ("bootstrap.enabled=false",)
PROBE_EXTRA = ("bootstrap.num_groups=8", "bootstrap.epochs=1")


class RestampError(RuntimeError):
    """A probe that cannot run, or a record that cannot be written (one line, what to do)."""


# ---------------------------------------------------------------------------------------------------------------
# Comparing lakes and numbers, bit for bit


def _canonical(value: Any) -> Any:
    """A value whose equality is bitwise: floats as their IEEE-754 bytes (so -0.0 != 0.0 and one ULP shows)."""
    if isinstance(value, float):
        return ("f", struct.pack("<d", value))
    if isinstance(value, list | tuple):
        if value and all(type(item) is int for item in value):
            return tuple(value)
        return tuple(_canonical(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _canonical(item)) for key, item in sorted(value.items()))
    return value


@dataclass
class TableDiff:
    """How two versions of one table differ: rows on one side only, and cells that differ (a few shown)."""

    table: str
    old_rows: int
    new_rows: int
    only_old: list[tuple] = field(default_factory=list)
    only_new: list[tuple] = field(default_factory=list)
    cells: list[tuple[tuple, str, Any, Any]] = field(default_factory=list)  # key, column, old, new
    differing_cells: int = 0

    @property
    def equal(self) -> bool:
        return not (self.only_old or self.only_new or self.differing_cells)

    def summary(self) -> str:
        if self.equal:
            return f"{self.table}: {self.old_rows} rows equal"
        parts = []
        if self.only_old:
            parts.append(f"{len(self.only_old)} row(s) only in the old lake (first {self.only_old[0]})")
        if self.only_new:
            parts.append(f"{len(self.only_new)} row(s) only in the new lake (first {self.only_new[0]})")
        if self.differing_cells:
            key, column, old, new = self.cells[0]
            parts.append(f"{self.differing_cells} cell(s) differ (first {column} at {key}: {old!r} -> {new!r})")
        return f"{self.table}: " + "; ".join(parts)


def compare_tables(
    name: str, old: pa.Table, new: pa.Table, key: Sequence[str], skip: Iterable[str] = (), shown: int = 5
) -> TableDiff:
    """Every row of ``old`` and ``new`` matched by ``key`` and compared column by column, bitwise (floats by their
    bytes), but for the columns in ``skip``. A key that occurs twice on one side is a difference too."""
    skipped = set(skip)
    columns = [c for c in old.column_names if c not in skipped]
    if sorted(columns) != sorted(c for c in new.column_names if c not in skipped):
        raise RestampError(f"{name}: the two lakes have other columns ({old.column_names} vs {new.column_names})")
    diff = TableDiff(name, old.num_rows, new.num_rows)
    sides = []
    for table in (old, new):
        rows: dict[tuple, dict[str, Any]] = {}
        for row in table.select(columns).to_pylist():
            ident = tuple(row[k] for k in key)
            if ident in rows:  # a duplicated key: the row counts twice, which is never equal
                ident = (*ident, f"duplicate #{sum(1 for r in rows if r[: len(key)] == ident)}")
            rows[ident] = row
        sides.append(rows)
    olds, news = sides
    diff.only_old = sorted((k for k in olds if k not in news), key=repr)
    diff.only_new = sorted((k for k in news if k not in olds), key=repr)
    for ident in sorted((k for k in olds if k in news), key=repr):
        a, b = olds[ident], news[ident]
        for column in columns:
            if _canonical(a[column]) != _canonical(b[column]):
                diff.differing_cells += 1
                if len(diff.cells) < shown:
                    diff.cells.append((ident, column, a[column], b[column]))
    return diff


def run_labels(lake_root: Path) -> dict[str, str]:
    """run id -> a label that names the same run in another probe's lake: a sweep point's id carries a hash of the
    code fingerprint (``<finding>-quick-<variant>-<hash>-p<i>``), so points are named by their sweep without the
    hash and their index; other runs (bootstraps) by their id."""
    from ragen_core.storage import query

    rows = query(lake_root, "SELECT run_id, sweep_id, sweep_point FROM runs").to_pylist()
    labels = {}
    for row in rows:
        sweep = row["sweep_id"]
        if sweep is not None and row["sweep_point"] is not None:
            labels[row["run_id"]] = f"{re.sub(r'-[0-9a-f]{8}$', '', sweep)}#p{row['sweep_point']}"
        else:
            labels[row["run_id"]] = row["run_id"]
    if len(set(labels.values())) != len(labels):
        raise RestampError(f"{lake_root}: two runs share a label; the probe's lake holds runs of another probe")
    return labels


def _lake_table(lake_root: Path, table: str, labels: dict[str, str]) -> pa.Table:
    """A table of the lake with every run id replaced by its label (and, for metrics, the timing rows left out)."""
    from ragen_core.storage import query

    sql = f"SELECT * FROM {table}"  # noqa: S608  (a name from TABLES, never from a user)
    if table == "metrics":
        sql += " WHERE NOT (" + " OR ".join("starts_with(name, ?)" for _ in TIMING_METRICS) + ")"
    data = query(lake_root, sql, params=list(TIMING_METRICS) if table == "metrics" else None)
    if "run_id" in data.column_names:
        ids = [labels.get(r, r) for r in data.column("run_id").to_pylist()]
        data = data.set_column(data.column_names.index("run_id"), "run_id", pa.array(ids, pa.string()))
    return data


def compare_lakes(old_root: Path, new_root: Path, tables: Sequence[str] = TABLES) -> list[TableDiff]:
    """Every table of ``tables`` of the two lakes, row by row and bit by bit (:func:`compare_tables`), runs matched by
    :func:`run_labels`, the timing keys (:data:`TIMING_METRICS`, :data:`TIMING_COLUMNS`) left out."""
    from schemas.tables import TABLES as SPECS

    old_labels, new_labels = run_labels(old_root), run_labels(new_root)
    diffs = []
    for table in tables:
        old = _lake_table(old_root, table, old_labels)
        new = _lake_table(new_root, table, new_labels)
        diffs.append(compare_tables(table, old, new, SPECS[table].key, TIMING_COLUMNS.get(table, ())))
    return diffs


def _relabelled(value: Any, labels: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {labels.get(k, k): _relabelled(v, labels) for k, v in value.items()}
    if isinstance(value, list):
        return [_relabelled(v, labels) for v in value]
    return labels.get(value, value) if isinstance(value, str) else value


def compare_numbers(old: Any, new: Any, path: str = "", shown: int = 5) -> list[str]:
    """Where two analyses' numbers differ (bitwise for floats; NaN equals NaN of the same bytes), as ``path: old ->
    new`` lines, the keys matching :data:`TIMING_NUMBERS` left out."""
    found: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if len(found) >= shown:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            kept = {k for k in (*a, *b) if not TIMING_NUMBERS.search(str(k))}
            for k in sorted(kept, key=str):
                if k not in a or k not in b:
                    found.append(f"{where}/{k}: only on one side")
                else:
                    walk(a[k], b[k], f"{where}/{k}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                found.append(f"{where}: {len(a)} -> {len(b)} items")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{where}[{i}]")
        elif _canonical(a) != _canonical(b) and not (_is_nan(a) and _is_nan(b)):
            found.append(f"{where}: {a!r} -> {b!r}")

    walk(old, new, path)
    return found


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


# ---------------------------------------------------------------------------------------------------------------
# The two checkouts and their runs


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RestampError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout.strip()


def export_commit(repo: Path, commit: str, folder: Path) -> Path:
    """The tree of ``commit`` written to ``folder`` (``git archive``: the repository itself is not touched)."""
    folder.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    assert archive.stdout is not None
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(folder, filter="data")
    if archive.wait() != 0:
        raise RestampError(f"git archive {commit} failed")
    return folder


def probe_overrides(quick: Sequence[str]) -> list[str]:
    """A finding's probe overrides: its quick ones, the bootstrap kept on (:data:`PROBE_DROP`) but short
    (:data:`PROBE_EXTRA`, where quick does not set the key itself)."""
    kept = [o for o in quick if o not in PROBE_DROP]
    keys = {o.split("=", 1)[0] for o in kept}
    return kept + [o for o in PROBE_EXTRA if o.split("=", 1)[0] not in keys]


def write_probe_specs(tree: Path) -> list[str]:
    """Turn every finding spec of the checkout at ``tree`` into its probe: its ``quick:`` section becomes
    :func:`probe_overrides` of it, with the spec's own seeds (every point). Returns the findings' names."""
    names = []
    for path in sorted((tree / "configs" / "findings").glob("*.yaml")):
        loaded = yaml.safe_load(path.read_text())
        section = loaded.get("finding") if isinstance(loaded, dict) else None
        if not isinstance(section, dict):
            continue
        names.append(path.stem)
        if section.get("runs_of"):
            continue
        quick = section.get("quick") or {}
        section["quick"] = {"overrides": probe_overrides([str(o) for o in quick.get("overrides") or []])}
        path.write_text(yaml.safe_dump(loaded, sort_keys=False))
    return names


LAUNCHER = '''"""Runs the ragen command of the checkout named first (written by a re-stamp probe)."""
import sys
from pathlib import Path

code = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(code))
import ragen_core  # noqa: E402

if not Path(ragen_core.__file__).resolve().is_relative_to(code):
    sys.exit(f"probe: ragen_core came from {ragen_core.__file__}, not from {code}")
if sys.argv[2] == "--digests":
    from ragen_core.findings.spec import load_finding, registered, spec_digest

    extra = {"fingerprint": sys.argv[3]} if len(sys.argv) > 3 else {}
    import json

    print(json.dumps({name: spec_digest(load_finding(name), **extra) for name in registered()}))
    sys.exit(0)
sys.argv = ["ragen", *sys.argv[2:]]
from ragen_cli.main import main  # noqa: E402

main()
'''


@dataclass
class Side:
    """One checkout of a probe: its commit, its fingerprint, its tree and what its runs wrote."""

    commit: str
    fingerprint: str
    tree: Path
    lake: Path | None = None
    out: Path | None = None
    seconds: float = 0.0


def _child_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    return env


def spec_digests(side: Side, launcher: Path, fingerprint: str | None = None) -> dict[str, str]:
    """Each finding's spec digest as the side's own code computes it (with ``fingerprint`` in place of its own when
    given: the new code's digest of the old code's runs)."""
    args = [sys.executable, str(launcher), str(side.tree), "--digests", *([fingerprint] if fingerprint else [])]
    done = subprocess.run(args, cwd=side.tree, env=_child_env(side.tree), capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RestampError(f"the spec digests of {side.commit[:12]} cannot be computed: {tail}")
    return json.loads(done.stdout)


def run_side(side: Side, launcher: Path, work: Path, name: str, coverage: Path | None, log: Callable[[str], None]):
    """``ragen reproduce --all --quick`` of the side's own checkout on the probe specs, its data root at
    ``work/run/data`` (the same path for both sides, then moved to ``work/<name>``), under coverage when asked."""
    run = work / "run"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir()
    command = [
        str(launcher),
        str(side.tree),
        "reproduce",
        "--all",
        "--quick",
        "--data-root",
        str(run / "data"),
        "--out-dir",
        str(run / "out"),
    ]
    if coverage is not None:
        include = str(side.tree / "ragen_core" / "*")
        command = ["-m", "coverage", "run", f"--data-file={coverage}", f"--include={include}", *command]
    log(f"probe: {name} side ({side.commit[:12]}, fingerprint {side.fingerprint}) runs every point")
    started = time.monotonic()
    with open(work / f"{name}.log", "w") as output:
        done = subprocess.run(
            [sys.executable, *command],
            cwd=side.tree,
            env=_child_env(side.tree),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    side.seconds = round(time.monotonic() - started, 1)
    if done.returncode != 0:
        raise RestampError(f"the {name} side's runs failed (exit {done.returncode}); its output: {work / name}.log")
    target = work / name
    if target.exists():
        shutil.rmtree(target)
    run.rename(target)
    side.lake, side.out = target / "data", target / "out"


# ---------------------------------------------------------------------------------------------------------------
# Which counted files changed, and whether the probe ran them


def counted(name: str) -> bool:
    """A path (relative, posix) that :func:`code_fingerprint` counts."""
    return name.startswith("ragen_core/") and name.endswith(".py") and not name.startswith(PLUMBING)


def changed_counted_files(old: Path, new: Path) -> dict[str, list[int] | None]:
    """Counted files whose code form differs between the trees: path -> the new side's changed line numbers (those
    ``git diff`` adds), or None for a file the new side removed."""
    names = {p.relative_to(t).as_posix() for t in (old, new) for p in (t / "ragen_core").rglob("*.py")}
    changed: dict[str, list[int] | None] = {}
    for name in sorted(n for n in names if counted(n) and "__pycache__" not in n):
        a, b = old / name, new / name
        if not b.exists():
            changed[name] = None
        elif not a.exists() or code_form(a.read_text()) != code_form(b.read_text()):
            changed[name] = _added_lines(a if a.exists() else None, b)
    return changed


def _added_lines(old: Path | None, new: Path) -> list[int]:
    """The line numbers of ``new`` that ``git diff --no-index`` adds to ``old`` (all of them for a new file)."""
    if old is None:
        return list(range(1, len(new.read_text().splitlines()) + 1))
    done = subprocess.run(["git", "diff", "--no-index", "-U0", str(old), str(new)], capture_output=True, text=True)
    lines = []
    for match in re.finditer(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", done.stdout, re.M):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        lines += range(start, start + count)
    return lines


def executed_lines(coverage_file: Path, tree: Path) -> dict[str, set[int]]:
    """path (relative to ``tree``) -> the lines the probe executed there, from coverage.py's data file."""
    from coverage import CoverageData

    data = CoverageData(basename=str(coverage_file))
    data.read()
    executed = {}
    for path in data.measured_files():
        resolved = Path(path).resolve()
        if resolved.is_relative_to(tree.resolve()):
            executed[resolved.relative_to(tree.resolve()).as_posix()] = set(data.lines(path) or ())
    return executed


def unexercised(changed: dict[str, list[int] | None], executed: dict[str, set[int]]) -> dict[str, str]:
    """The changed counted files the probe did not exercise, each with why: a changed file must have one of its
    changed lines executed (or, where the change only removed lines, any line); a removed file needs nothing."""
    missing = {}
    for name, lines in changed.items():
        if lines is None:
            continue
        ran = executed.get(name, set())
        if not ran:
            missing[name] = "no line of it ran"
        elif lines and not ran.intersection(lines):
            missing[name] = f"none of its {len(lines)} changed line(s) ran"
    return missing


# ---------------------------------------------------------------------------------------------------------------
# The probe and its record


@dataclass
class ProbeResult:
    """What a probe found: the two sides, the comparisons, the files it did not exercise and the digests that moved."""

    old: Side
    new: Side
    findings: list[str]
    tables: list[TableDiff]
    numbers: dict[str, list[str]]  # finding -> differences of its analysis numbers
    changed: dict[str, list[int] | None]
    unexercised: dict[str, str]
    points: dict[str, list[str]]  # finding -> the labels of its probe runs
    seconds: float

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables) and not any(self.numbers.values())

    @property
    def passed(self) -> bool:
        return self.equal and not self.unexercised and bool(self.changed)

    def problems(self) -> list[str]:
        lines = [t.summary() for t in self.tables if not t.equal]
        lines += [
            f"{name}'s numbers: {diffs[0]}" + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else "")
            for name, diffs in self.numbers.items()
            if diffs
        ]
        lines += [f"{name}: the probe did not exercise it ({why})" for name, why in self.unexercised.items()]
        if not self.changed:
            lines.append("no counted file changed between the two commits: nothing to re-stamp")
        return lines


def cpu() -> dict[str, Any]:
    """The machine kind the numbers are bitwise on: the CPU model, torch's CPU capability and its threads."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "model": model,
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
    }


def probe(
    repo: Path,
    from_commit: str,
    to_commit: str,
    work: Path,
    log: Callable[[str], None] = print,
    only: Sequence[str] | None = None,
) -> ProbeResult:
    """Run the probe of every registered finding (or those in ``only``) at ``from_commit`` and at ``to_commit`` in
    ``work`` and compare them (:class:`ProbeResult`). Refuses, before any run, a change of a finding's spec, config
    or defaults (its spec digest under the old fingerprint moves)."""
    started = time.monotonic()
    commits = [_git(repo, "rev-parse", "--verify", f"{c}^{{commit}}") for c in (from_commit, to_commit)]
    work.mkdir(parents=True, exist_ok=True)
    launcher = work / "launch.py"
    launcher.write_text(LAUNCHER)
    sides = []
    for name, commit in zip(("old", "new"), commits, strict=True):
        tree = work / f"code-{name}"
        if tree.exists():
            shutil.rmtree(tree)
        export_commit(repo, commit, tree)
        sides.append(Side(commit, code_fingerprint(tree), tree))
    old, new = sides
    changed = changed_counted_files(old.tree, new.tree)
    if not changed:
        raise RestampError(
            f"no counted file changed between {commits[0][:12]} and {commits[1][:12]} (fingerprint "
            f"{old.fingerprint}): nothing to re-stamp"
        )
    before, after = spec_digests(old, launcher), spec_digests(new, launcher, old.fingerprint)
    moved = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if moved:
        raise RestampError(
            f"the spec, config or defaults of {', '.join(moved)} changed between the commits: a "
            "re-stamp cannot vouch for that; regenerate (ragen reproduce --all)"
        )
    if only:
        unknown = sorted(set(only) - set(before))
        if unknown:
            raise RestampError(f"unknown finding(s) {unknown}; registered: {', '.join(before)}")
    findings = write_probe_specs(old.tree)
    if write_probe_specs(new.tree) != findings:
        raise RestampError("the two commits register other findings")
    if only:
        keep = set(only) | {_runs_of(old.tree, name) for name in only} - {None}
        for side in sides:  # the other findings' specs left out of the probe's trees
            for name in set(findings) - keep:
                (side.tree / "configs" / "findings" / f"{name}.yaml").unlink()
        findings = [f for f in findings if f in keep]
    coverage = work / "coverage.data"
    if coverage.exists():
        coverage.unlink()
    run_side(old, launcher, work, "old", None, log)
    run_side(new, launcher, work, "new", coverage, log)
    assert old.lake and new.lake and old.out and new.out
    log("probe: comparing the two lakes row by row")
    tables = compare_lakes(old.lake, new.lake)
    old_labels, new_labels = run_labels(old.lake), run_labels(new.lake)
    numbers, points = {}, {}
    for name in findings:
        a = json.loads((old.out / f"{name}-quick.json").read_text())
        b = json.loads((new.out / f"{name}-quick.json").read_text())
        numbers[name] = compare_numbers(
            _relabelled({"numbers": a["numbers"], "held_out": a["held_out"]}, old_labels),
            _relabelled({"numbers": b["numbers"], "held_out": b["held_out"]}, new_labels),
        )
        points[name] = sorted(
            old_labels[run] for run in old_labels if any(run.startswith(s) for s in a["sweeps"].values())
        )
    missing = unexercised(changed, executed_lines(coverage, new.tree))
    return ProbeResult(
        old, new, findings, tables, numbers, changed, missing, points, round(time.monotonic() - started, 1)
    )


def _runs_of(tree: Path, name: str) -> str | None:
    """The finding whose runs ``name`` analyses (its spec's ``runs_of``), if any."""
    section = (yaml.safe_load((tree / "configs" / "findings" / f"{name}.yaml").read_text()) or {}).get("finding")
    return (section or {}).get("runs_of")


def record_of(result: ProbeResult) -> dict[str, Any]:
    """The record a passed probe leaves: the two commits and fingerprints, the points, the row counts, the changed
    files and how many of their changed lines ran, the machine and the library versions, and the probe's time."""
    return {
        "from": {"commit": result.old.commit, "fingerprint": result.old.fingerprint},
        "to": {"commit": result.new.commit, "fingerprint": result.new.fingerprint},
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "probe": {
            "command": "ragen reproduce --all --quick, each spec's quick section turned into its probe",
            "overrides": {"dropped": list(PROBE_DROP), "added": list(PROBE_EXTRA)},
            "seeds": "every seed of the spec",
        },
        "findings": result.findings,
        "points": result.points,
        "rows": {t.table: t.old_rows for t in result.tables},
        "excluded": {
            "metrics": list(TIMING_METRICS),
            "columns": TIMING_COLUMNS,
            "analysis_keys": TIMING_NUMBERS.pattern,
        },
        "changed_files": {name: (None if lines is None else len(lines)) for name, lines in result.changed.items()},
        "seconds": {"old": result.old.seconds, "new": result.new.seconds, "total": result.seconds},
        "cpu": cpu(),
        "versions": library_versions(),
    }


def record_path(repo: Path, result_or_record: ProbeResult | dict[str, Any]) -> Path:
    if isinstance(result_or_record, ProbeResult):
        a, b = result_or_record.old.fingerprint, result_or_record.new.fingerprint
    else:
        a, b = result_or_record["from"]["fingerprint"], result_or_record["to"]["fingerprint"]
    return repo / RECORDS / f"{a}-{b}.json"


def records(repo: Path) -> list[dict[str, Any]]:
    """The committed re-stamp records, oldest first."""
    folder = repo / RECORDS
    found = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted(found, key=lambda r: r["date"])


def reaches(start: str, target: str, repo: Path) -> list[dict[str, Any]] | None:
    """The chain of records that links fingerprint ``start`` to ``target`` (empty when they are equal), or None."""
    edges: dict[str, list[dict[str, Any]]] = {}
    for record in records(repo):
        edges.setdefault(record["from"]["fingerprint"], []).append(record)
    chains: list[tuple[str, list[dict[str, Any]]]] = [(start, [])]
    seen = {start}
    while chains:
        here, chain = chains.pop(0)
        if here == target:
            return chain
        for record in edges.get(here, []):
            there = record["to"]["fingerprint"]
            if there not in seen:
                seen.add(there)
                chains.append((there, [*chain, record]))
    return None


def stamped_commit(repo: Path, fingerprint: str, start_commit: str) -> str:
    """The newest commit vouched for from ``fingerprint`` (the findings' own commit ``start_commit`` when no record
    leads on from it): where the next probe starts."""
    commit, here = start_commit, fingerprint
    while True:
        nxt = [r for r in records(repo) if r["from"]["fingerprint"] == here]
        if not nxt:
            return commit
        commit, here = nxt[-1]["to"]["commit"], nxt[-1]["to"]["fingerprint"]


__all__ = [
    "PROBE_DROP",
    "PROBE_EXTRA",
    "RECORDS",
    "TABLES",
    "TIMING_COLUMNS",
    "TIMING_METRICS",
    "TIMING_NUMBERS",
    "ProbeResult",
    "RestampError",
    "TableDiff",
    "changed_counted_files",
    "compare_lakes",
    "compare_numbers",
    "compare_tables",
    "probe",
    "reaches",
    "record_of",
    "record_path",
    "records",
    "stamped_commit",
    "unexercised",
]
