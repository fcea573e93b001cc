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

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

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
from ragen_core.findings.provenance import code_fingerprint, library_versions, machine
from ragen_core.findings.restamp_records import RECORDS, reaches, record_path, records, stamped_commit
from ragen_core.storage.files import atomic_write_bytes

# The probe's settings on top of each finding's own ``quick`` overrides: every point (the spec's seeds, not quick's),
# the bootstrap on but short, so that each point bootstraps, validates and updates at least once.
PROBE_DROP = ("bootstrap.enabled=false",)
PROBE_EXTRA = ("bootstrap.num_groups=8", "bootstrap.epochs=1")
# The probe's own runs beside the findings' points: code no finding runs (the file says which and why).
PATHS = "configs/restamp/paths.yaml"


class RestampError(RuntimeError):
    """A probe that cannot run, or a record that cannot be written (one line, what to do)."""


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


def probe_paths(tree: Path, names: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The probe paths of the checkout at ``tree`` (:data:`PATHS`), or only those in ``names``: name -> the
    ``ragen train`` arguments of its run but the data root. A missing file means no path."""
    path = tree / PATHS
    loaded = yaml.safe_load(path.read_text()) if path.exists() else {"paths": {}}
    declared = loaded.get("paths") if isinstance(loaded, dict) else None
    if not isinstance(declared, dict):
        raise RestampError(f"{PATHS}: write paths: {{name: {{config: ..., overrides: [...]}}}}")
    unknown = sorted(set(names or ()) - set(declared))
    if unknown:
        raise RestampError(f"unknown probe path(s) {unknown}; {PATHS} declares: {', '.join(declared) or 'none'}")
    runs = {}
    for name, path_spec in declared.items():
        if names is not None and name not in names:
            continue
        if not isinstance(path_spec, dict) or not isinstance(path_spec.get("config"), str):
            raise RestampError(f"{PATHS}: path {name!r} needs config: <a YAML file> and overrides: [key=value, ...]")
        overrides = [str(o) for o in path_spec.get("overrides") or []]
        runs[name] = ["train", "--config", path_spec["config"], "--run-id", f"probe-{name}", *overrides]
    return runs


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
    lake: Path = Path()  # set once its runs are done
    out: Path = Path()
    seconds: float = 0.0
    reused: bool = False  # its runs are those of an earlier probe in the same folder (:func:`side_stamp`)


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


# The environment variables a side's stamp records: those that can change what its runs compute
STAMPED_VARIABLES = ("OMP_", "MKL_", "TORCH_", "CUBLAS_", "CUDA_", "DS_", "RAGEN_")
# The file in a side's folder that says what made its runs (written once they all succeeded)
SIDE_STAMP = "side.json"


def side_stamp(side: Side, launcher: Path, commands: dict[str, list[str]]) -> dict[str, Any]:
    """Everything a side's rows depend on besides its data: the commit and its fingerprint, the commands (with the
    data-root path), the probe specs written into its tree, the launcher, the interpreter, the library versions, the
    machine kind and the environment variables that steer the kernels. An earlier side with an equal stamp wrote the
    rows this side would write, bit for bit (the premise of the whole probe)."""
    specs = hashlib.sha256()
    for path in sorted((side.tree / "configs" / "findings").glob("*.yaml")):
        specs.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {
        "commit": side.commit,
        "fingerprint": side.fingerprint,
        "commands": commands,
        "specs": specs.hexdigest(),
        "launcher": hashlib.sha256(launcher.read_bytes()).hexdigest(),
        "python": sys.executable,
        "versions": library_versions(),
        "cpu": machine(),
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(STAMPED_VARIABLES)},
    }


def stamped_side(target: Path, stamp: dict[str, Any]) -> float | None:
    """The seconds of the side in ``target`` when its stamp equals ``stamp`` (None: none there, or another)."""
    try:
        earlier = json.loads((target / SIDE_STAMP).read_text())
    except (OSError, ValueError):
        return None
    seconds = earlier.pop("seconds", None) if isinstance(earlier, dict) else None
    return float(seconds) if earlier == stamp and isinstance(seconds, (int, float)) else None


def run_side(
    side: Side,
    launcher: Path,
    work: Path,
    name: str,
    coverage: Path | None,
    log: Callable[[str], None],
    paths: dict[str, list[str]] | None = None,
    added: Sequence[str] = (),
    points: bool = True,
    measured: Sequence[Path] = (),
    reuse: bool = False,
):
    """``ragen reproduce --all --quick`` of the side's own checkout on the probe specs (unless ``points`` is False:
    a probe of its paths alone), then the probe ``paths``' runs (:func:`probe_paths`) one after the other, their
    data root at ``work/run/data`` (the same path for both sides, then moved to ``work/<name>``), under coverage
    when asked (``coverage``: its data file; it measures the ``measured`` files alone, and does not run when there
    are none). The ``added`` findings (registered by this side alone) are left out of that and run last, each
    ``ragen reproduce NAME --quick`` into ``work/run/added`` (a finding that analyses another's runs, into the
    compared data root, where those runs are): their rows are not compared, but their code ran.

    With ``reuse``, a side already in ``work/<name>`` whose stamp (:func:`side_stamp`) equals this one's is kept
    instead of run again: a probe run again in the same folder (say after a fix to the new commit) runs its new side
    alone."""
    run = work / "run"
    root = ["--data-root", str(run / "data")]
    commands = {}
    if points:  # no finding's points when the probe runs its paths alone
        commands["the findings' points"] = ["reproduce", "--all", "--quick", *root, "--out-dir", str(run / "out")]
    commands |= {f"probe path {path}": [*args[:1], *root, *args[1:]] for path, args in (paths or {}).items()}
    specs = side.tree / "configs" / "findings"
    for finding in added:
        own = ["--data-root", str(run / ("data" if _runs_of(side.tree, finding) else "added"))]
        commands[f"new finding {finding}"] = ["reproduce", finding, "--quick", *own, "--out-dir", str(run / "out")]
    target = work / name
    stamp = side_stamp(side, launcher, commands)
    seconds = stamped_side(target, stamp) if reuse else None
    if seconds is not None:
        log(
            f"probe: {name} side ({side.commit[:12]}) reused from {target}: the same commit, specs, commands, "
            "libraries and machine ran there"
        )
        side.seconds, side.reused = seconds, True
        side.lake, side.out = target / "data", target / "out"
        return
    if run.exists():
        shutil.rmtree(run)
    run.mkdir()
    for finding in added:
        (specs / f"{finding}.yaml").rename(specs / f"{finding}.added")  # not one of --all's findings
    log(f"probe: {name} side ({side.commit[:12]}, fingerprint {side.fingerprint}) runs every point and path")
    started = time.monotonic()
    with open(work / f"{name}.log", "w") as output:
        for what, args in commands.items():
            if what.startswith("new finding "):  # back in place for its own run
                hidden = specs / f"{what.removeprefix('new finding ')}.added"
                hidden.rename(hidden.with_suffix(".yaml"))
            command = [str(launcher), str(side.tree), *args]
            if coverage is not None and measured:
                include = ",".join(map(str, measured))
                measure = ["-m", "coverage", "run", "--append", f"--data-file={coverage}", f"--include={include}"]
                command = [*measure, *command]
            output.write(f"$ ragen {' '.join(args)}\n")
            output.flush()
            done = subprocess.run(
                [sys.executable, *command],
                cwd=side.tree,
                env=_child_env(side.tree),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                raise RestampError(
                    f"the {name} side's runs failed in {what} (exit {done.returncode}); its output: {work / name}.log"
                )
    side.seconds = round(time.monotonic() - started, 1)
    if target.exists():
        shutil.rmtree(target)
    run.rename(target)
    side.lake, side.out = target / "data", target / "out"
    atomic_write_bytes(target / SIDE_STAMP, json.dumps({**stamp, "seconds": side.seconds}, indent=1).encode())


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
    old, new = _checkouts(repo, (from_commit, to_commit), work)
    changed = changed_counted_files(old.tree, new.tree)
    if not changed:
        raise RestampError(
            f"no counted file changed between {old.commit[:12]} and {new.commit[:12]} (fingerprint "
            f"{old.fingerprint}): nothing to re-stamp"
        )
    findings, added = _probe_specs(old, new, launcher, only)
    runs = probe_paths(new.tree, paths)
    same = reformatted(changed, old.tree, new.tree)
    # coverage measures only the files whose executed lines the probe asks about (a changed statement, not a removed
    # file nor one whose syntax is unchanged): tracing every line of ragen_core made each command ~45% slower
    measured = [new.tree / name for name, lines in changed.items() if lines is not None and name not in same]
    coverage = work / "coverage.data"
    coverage.unlink(missing_ok=True)
    run_side(old, launcher, work, "old", None, log, runs, points=bool(findings), reuse=True)
    run_side(new, launcher, work, "new", coverage, log, runs, added, points=bool(findings), measured=measured)
    log("probe: comparing the two lakes row by row")
    tables = compare_lakes(old.lake, new.lake)
    numbers, points = _compare_analyses(old, new, findings)
    executed = executed_lines(coverage, new.tree) if coverage.exists() else {}
    missing = unexercised(changed, executed, new.tree, same)
    seconds = round(time.monotonic() - started, 1)
    return ProbeResult(old, new, findings, tables, numbers, changed, missing, points, seconds, runs, added, same)


def _checkouts(repo: Path, commits: Sequence[str], work: Path) -> tuple[Side, Side]:
    """The two commits' trees written under ``work`` (``code-old``, ``code-new``), each with its fingerprint."""
    sides = []
    for name, given in zip(("old", "new"), commits, strict=True):
        commit = _git(repo, "rev-parse", "--verify", f"{given}^{{commit}}")
        tree = work / f"code-{name}"
        if tree.exists():
            shutil.rmtree(tree)
        export_commit(repo, commit, tree)
        sides.append(Side(commit, code_fingerprint(tree), tree))
    return sides[0], sides[1]


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
        keep = set(only) | {_runs_of(new.tree, name) for name in only} - {None}
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


def _runs_of(tree: Path, name: str) -> str | None:
    """The finding whose runs ``name`` analyses (its spec's ``runs_of``), if any."""
    section = (yaml.safe_load((tree / "configs" / "findings" / f"{name}.yaml").read_text()) or {}).get("finding")
    return (section or {}).get("runs_of")


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
    "PROBE_DROP",
    "PROBE_EXTRA",
    "PATHS",
    "RECORDS",
    "ProbeResult",
    "RestampError",
    "TableDiff",
    "changed_counted_files",
    "compare_lakes",
    "compare_numbers",
    "probe",
    "probe_paths",
    "reaches",
    "record_of",
    "record_path",
    "records",
    "stamped_commit",
    "unexercised",
]
