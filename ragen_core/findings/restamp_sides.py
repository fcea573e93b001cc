"""The two sides of a re-stamp probe (:mod:`ragen_core.findings.restamp`): each commit's tree exported, the
findings' specs turned into their probes, and each side's runs (the findings' points and the probe paths) run by
its own code, stamped so that a probe run again reuses a side that would write the same rows. Plumbing, like the
probe (:data:`ragen_core.lineage.PLUMBING`)."""

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ragen_core.findings.provenance import code_fingerprint, library_versions, machine
from ragen_core.storage.files import atomic_write_bytes

# The probe's settings on top of each finding's own ``quick`` overrides: every point (the spec's seeds, not quick's),
# the bootstrap on but short, so that each point bootstraps, validates and updates at least once.
PROBE_DROP = ("bootstrap.enabled=false",)
PROBE_EXTRA = ("bootstrap.num_groups=8", "bootstrap.epochs=1")
# The probe's own runs beside the findings' points: code no finding runs (the file says which and why).
PATHS = "configs/restamp/paths.yaml"


class RestampError(RuntimeError):
    """A probe that cannot run, or a record that cannot be written (one line, what to do)."""


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
        own = ["--data-root", str(run / ("data" if runs_of(side.tree, finding) else "added"))]
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


def checkouts(repo: Path, commits: Sequence[str], work: Path) -> tuple[Side, Side]:
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


def runs_of(tree: Path, name: str) -> str | None:
    """The finding whose runs ``name`` analyses (its spec's ``runs_of``), if any."""
    section = (yaml.safe_load((tree / "configs" / "findings" / f"{name}.yaml").read_text()) or {}).get("finding")
    return (section or {}).get("runs_of")


__all__ = [
    "LAUNCHER",
    "PATHS",
    "PROBE_DROP",
    "PROBE_EXTRA",
    "SIDE_STAMP",
    "STAMPED_VARIABLES",
    "RestampError",
    "Side",
    "checkouts",
    "export_commit",
    "probe_overrides",
    "probe_paths",
    "run_side",
    "runs_of",
    "side_stamp",
    "spec_digests",
    "stamped_side",
    "write_probe_specs",
]
