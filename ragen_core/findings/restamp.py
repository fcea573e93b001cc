"""Re-stamping the committed findings: evidence that a code change moves none of their numbers, bought cheaply.

A finding's JSON names the code fingerprint that made its numbers. When the counted code changes, the numbers are
either made again (``ragen reproduce --all``, hours) or the change is *probed*: both checkouts, the commit that made
the numbers and the new one, run the first few iterations of every point of every finding on this machine, one
after the other on the same data-root path, and every row they write is compared bit for bit. A probe that finds
every row and every analysis number equal, every changed counted file executed, and every finding's spec, config and
defaults unchanged writes a record under ``docs/findings/restamps/``; the digest test accepts a finding whose
fingerprint reaches the checkout's through a chain of such records. Nothing here decides a number: the module is
plumbing (:data:`ragen_core.findings.provenance.PLUMBING`). The two sides, each commit's tree and its runs, are
:mod:`ragen_core.findings.restamp_sides`; here, the probe that compares them and its record.

Why the same machine: bitwise equality holds per CPU kind (the kernels torch picks differ between AVX2 and AVX-512
machines), so a probe compares two codes, never two machines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ragen_core.findings.bitwise import (
    TIMING_COLUMNS,
    TIMING_METRICS,
    TIMING_NUMBERS,
    TableDiff,
    compare_lakes,
    compare_numbers,
    relabelled,
    run_labels,
)
from ragen_core.findings.changes import changed_counted_files, executed_lines, reformatted, unexercised
from ragen_core.findings.provenance import library_versions, machine
from ragen_core.findings.restamp_records import RECORDS, reaches, record_path, records, stamped_commit
from ragen_core.findings.restamp_sides import (
    LAUNCHER,
    PATHS,
    PROBE_DROP,
    PROBE_EXTRA,
    SIDE_STAMP,
    STAMPED_VARIABLES,
    RestampError,
    Side,
    SidePaths,
    checkouts,
    export_commit,
    path_servers,
    probe_overrides,
    probe_paths,
    run_side,
    runs_of,
    side_stamp,
    spec_digests,
    stamped_side,
    write_probe_specs,
)

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
    paths: dict[str, list[str]] = field(default_factory=dict)  # probe path -> its run's arguments
    added: list[str] = field(default_factory=list)  # findings only the new commit registers, run on its side alone
    same: list[str] = field(default_factory=list)  # changed files whose syntax tree is unchanged (a reformat)
    fresh_paths: list[str] = field(default_factory=list)  # probe paths run on the new side alone (not compared)

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


def probe(
    repo: Path,
    from_commit: str,
    to_commit: str,
    work: Path,
    log: Callable[[str], None] = print,
    only: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
) -> ProbeResult:
    """Run the probe of every registered finding (or those in ``only``: an empty list probes the paths alone) and
    every probe path of the new commit's :data:`PATHS` (or those in ``paths``) at ``from_commit`` and at
    ``to_commit`` in ``work`` and compare them (:class:`ProbeResult`). Refuses, before any run, a pair of commits
    with no changed counted file, and a change of a finding's spec, config or defaults (its spec digest under the
    old fingerprint moves)."""
    started = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    launcher = work / "launch.py"
    launcher.write_text(LAUNCHER)
    old, new = checkouts(repo, (from_commit, to_commit), work)
    changed = changed_counted_files(old.tree, new.tree)
    if not changed:
        raise RestampError(
            f"no counted file changed between {old.commit[:12]} and {new.commit[:12]} (fingerprint "
            f"{old.fingerprint}): nothing to re-stamp"
        )
    findings, added = _probe_specs(old, new, launcher, only)
    runs = probe_paths(new.tree, paths)
    fresh = sorted(set(runs) - set(probe_paths(old.tree)))  # paths the old commit's file does not declare
    servers = path_servers(new.tree)
    same = reformatted(changed, old.tree, new.tree)
    # coverage measures only the files whose executed lines the probe asks about (a changed statement, not a removed
    # file nor one whose syntax is unchanged): tracing every line of ragen_core made each command ~45% slower
    measured = [new.tree / name for name, lines in changed.items() if lines is not None and name not in same]
    coverage = work / "coverage.data"
    for stale in (coverage, *work.glob(f"{coverage.name}.*")):  # an earlier probe's in this folder
        stale.unlink(missing_ok=True)
    shared = {n: a for n, a in runs.items() if n not in fresh}
    old_paths = SidePaths(shared, (), {n: s for n, s in servers.items() if n in shared})
    run_side(old, launcher, work, "old", None, log, old_paths, points=bool(findings), reuse=True)
    both = SidePaths(runs, fresh, servers)
    run_side(new, launcher, work, "new", coverage, log, both, added, points=bool(findings), measured=measured)
    log("probe: comparing the two lakes row by row")
    tables = compare_lakes(old.lake, new.lake)
    numbers, points = _compare_analyses(old, new, findings)
    executed = executed_lines(coverage, new.tree) if coverage.exists() else {}
    missing = unexercised(changed, executed, new.tree, same)
    seconds = round(time.monotonic() - started, 1)
    return ProbeResult(
        old, new, findings, tables, numbers, changed, missing, points, seconds, runs, added, same, fresh
    )


def _probe_specs(old: Side, new: Side, launcher: Path, only: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Check that no finding's spec digest moved, then write the probe specs into both trees (only those of
    ``only`` and the findings whose runs they analyse); the findings probed on both sides, and the findings only the
    new commit registers (run on the new side alone: nothing old vouches for their numbers, which come from their own
    ``ragen reproduce`` at the new commit, but their code counts toward what the probe ran)."""
    with ThreadPoolExecutor(1) as pool:  # the two sides' processes at once (each is mostly its imports, ~3 s)
        old_digests = pool.submit(spec_digests, old, launcher)
        after = spec_digests(new, launcher, old.fingerprint)
        before = old_digests.result()
    removed = sorted(set(before) - set(after))
    if removed:
        raise RestampError(
            f"the new commit no longer registers {', '.join(removed)}: remove its JSON and picture, and re-stamp "
            "from the commit that removes them"
        )
    added = sorted(set(after) - set(before))
    moved = sorted(n for n in before if before[n] != after[n])
    if moved:
        raise RestampError(
            f"the spec, config or defaults of {', '.join(moved)} changed between the commits: a "
            "re-stamp cannot vouch for that; regenerate (ragen reproduce --all)"
        )
    unknown = sorted(set(only or ()) - set(before) - set(added))
    if unknown:
        raise RestampError(f"unknown finding(s) {unknown}; registered: {', '.join(sorted(after))}")
    findings = write_probe_specs(old.tree)
    if sorted(set(write_probe_specs(new.tree)) - set(added)) != sorted(findings):
        raise RestampError("the two commits register other findings")
    if only is not None:
        keep = set(only) | {runs_of(new.tree, name) for name in only} - {None}
        for side in (old, new):  # the other findings' specs left out of the probe's trees
            for name in (set(findings) | set(added)) - keep:
                (side.tree / "configs" / "findings" / f"{name}.yaml").unlink(missing_ok=True)
        findings, added = [f for f in findings if f in keep], [f for f in added if f in keep]
    return findings, added


def _compare_analyses(old: Side, new: Side, findings: Sequence[str]) -> tuple[dict, dict]:
    """Per finding: the differences between the two sides' analysis numbers (and held-out reports), and the labels
    of its probe runs."""
    old_labels, new_labels = run_labels(old.lake), run_labels(new.lake)
    numbers, points = {}, {}
    for name in findings:
        a = json.loads((old.out / f"{name}-quick.json").read_text())
        b = json.loads((new.out / f"{name}-quick.json").read_text())
        numbers[name] = compare_numbers(
            relabelled({"numbers": a["numbers"], "held_out": a["held_out"]}, old_labels),
            relabelled({"numbers": b["numbers"], "held_out": b["held_out"]}, new_labels),
        )
        sweeps = tuple(a["sweeps"].values())
        points[name] = sorted(label for run, label in old_labels.items() if run.startswith(sweeps))
    return numbers, points


def record_of(result: ProbeResult) -> dict[str, Any]:
    """The record a passed probe leaves: the two commits and fingerprints, the points, the row counts, the changed
    files (how many lines of each, and which changed form only), the machine, the library versions and the time."""
    return {
        "from": {"commit": result.old.commit, "fingerprint": result.old.fingerprint},
        "to": {"commit": result.new.commit, "fingerprint": result.new.fingerprint},
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "probe": {
            "command": "ragen reproduce --all --quick, each spec's quick section turned into its probe; then "
            f"ragen train of each probe path ({PATHS})",
            "overrides": {"dropped": list(PROBE_DROP), "added": list(PROBE_EXTRA)},
            "seeds": "every seed of the spec",
        },
        "findings": result.findings,
        "new_findings": result.added,
        "points": result.points,
        "paths": {name: args[1:] for name, args in result.paths.items()},
        "new_paths": result.fresh_paths,
        "rows": {t.table: t.old_rows for t in result.tables},
        "new_columns": {t.table: t.new_columns for t in result.tables if t.new_columns},
        "excluded": {
            "metrics": list(TIMING_METRICS),
            "columns": TIMING_COLUMNS,
            "analysis_keys": TIMING_NUMBERS.pattern,
        },
        "changed_files": {name: (None if lines is None else len(lines)) for name, lines in result.changed.items()},
        "same_syntax_files": result.same,
        "seconds": {"old": result.old.seconds, "new": result.new.seconds, "total": result.seconds},
        "old_side_reused": result.old.reused,
        "cpu": machine(),
        "versions": library_versions(),
    }


__all__ = [
    "LAUNCHER",
    "PATHS",
    "PROBE_DROP",
    "PROBE_EXTRA",
    "RECORDS",
    "SIDE_STAMP",
    "STAMPED_VARIABLES",
    "ProbeResult",
    "RestampError",
    "Side",
    "TableDiff",
    "changed_counted_files",
    "compare_lakes",
    "compare_numbers",
    "export_commit",
    "probe",
    "probe_overrides",
    "probe_paths",
    "reaches",
    "record_of",
    "record_path",
    "records",
    "run_side",
    "side_stamp",
    "spec_digests",
    "stamped_commit",
    "stamped_side",
    "unexercised",
    "write_probe_specs",
]
