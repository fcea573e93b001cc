"""The two sides of a re-stamp probe (:mod:`ragen_core.findings.restamp`): each commit's tree exported, the
findings' specs turned into their probes, and each side's runs (the findings' points and the probe paths) run by
its own code, stamped so that a probe run again reuses a side that would write the same rows. Plumbing, like the
probe (:data:`ragen_core.lineage.PLUMBING`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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


def _declared(tree: Path) -> dict[str, Any]:
    path = tree / PATHS
    loaded = yaml.safe_load(path.read_text()) if path.exists() else {"paths": {}}
    declared = loaded.get("paths") if isinstance(loaded, dict) else None
    if not isinstance(declared, dict):
        raise RestampError(f"{PATHS}: write paths: {{name: {{config: ..., overrides: [...]}}}}")
    for name, path_spec in declared.items():
        if not isinstance(path_spec, dict) or not isinstance(path_spec.get("config"), str):
            raise RestampError(f"{PATHS}: path {name!r} needs config: <a YAML file> and overrides: [key=value, ...]")
        serve = path_spec.get("serve")
        if serve is not None and not (isinstance(serve, list) and serve and all(isinstance(a, str) for a in serve)):
            raise RestampError(f"{PATHS}: path {name!r}: serve: is the list of `ragen env serve` arguments")
    return declared


def probe_paths(tree: Path, names: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The probe paths of the checkout at ``tree`` (:data:`PATHS`), or only those in ``names``: name -> the
    ``ragen train`` arguments of its run but the data root. A missing file means no path."""
    declared = _declared(tree)
    unknown = sorted(set(names or ()) - set(declared))
    if unknown:
        raise RestampError(f"unknown probe path(s) {unknown}; {PATHS} declares: {', '.join(declared) or 'none'}")
    runs = {}
    for name, path_spec in declared.items():
        if names is not None and name not in names:
            continue
        overrides = [str(o) for o in path_spec.get("overrides") or []]
        runs[name] = ["train", "--config", path_spec["config"], "--run-id", f"probe-{name}", *overrides]
    return runs


def path_servers(tree: Path) -> dict[str, list[str]]:
    """The env servers of the checkout's probe paths: name -> the ``ragen env serve`` arguments of a path that
    declares ``serve:`` (its overrides name the server's URL as ``env.remote``, its port fixed in the file so that
    both sides' configs are equal). The probe starts the server, under the same coverage as the run, before the
    path's run and stops it (SIGINT, as Ctrl-C) once the run ends."""
    return {name: list(spec["serve"]) for name, spec in _declared(tree).items() if spec.get("serve")}


def _start_server(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """A path's env server started in its own session, writing to ``log``, once it printed its URL (at most
    120 s; a server that stops or never says it listens is a RestampError with its log)."""
    with open(log, "w") as handle:
        server = subprocess.Popen(
            command,
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        if "ragen env serve: http" in log.read_text(errors="replace"):
            return server
        time.sleep(0.1)
    _stop_server(server)
    raise RestampError(f"a probe path's env server did not start; its output: {log}")


def _stop_server(server: subprocess.Popen) -> None:
    """Ctrl-C to the server (its coverage data is then written), SIGKILL after 30 s; reaped either way."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


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


@dataclass
class SidePaths:
    """The probe paths a side runs: ``runs`` (name -> the ``ragen train`` arguments but the data root), those of
    them ``fresh`` to this side (paths the old commit's file does not declare: run on the new side alone, into
    ``work/run/added``, their rows not compared but their code measured, as for an added finding), and the env
    ``servers`` some of them play (:func:`path_servers`)."""

    runs: dict[str, list[str]] = field(default_factory=dict)
    fresh: Sequence[str] = ()
    servers: dict[str, list[str]] = field(default_factory=dict)


def _side_commands(run: Path, tree: Path, paths: SidePaths, added: Sequence[str], points: bool) -> dict[str, list]:
    root = ["--data-root", str(run / "data")]
    commands = {}
    if points:  # no finding's points when the probe runs its paths alone
        commands["the findings' points"] = ["reproduce", "--all", "--quick", *root, "--out-dir", str(run / "out")]
    for path, args in paths.runs.items():
        fresh = path in paths.fresh
        own = ["--data-root", str(run / ("added" if fresh else "data"))]
        commands[f"{'new ' if fresh else ''}probe path {path}"] = [*args[:1], *own, *args[1:]]
    for finding in added:
        own = ["--data-root", str(run / ("data" if runs_of(tree, finding) else "added"))]
        commands[f"new finding {finding}"] = ["reproduce", finding, "--quick", *own, "--out-dir", str(run / "out")]
    return commands


def run_side(
    side: Side,
    launcher: Path,
    work: Path,
    name: str,
    coverage: Path | None,
    log: Callable[[str], None],
    paths: SidePaths | None = None,
    added: Sequence[str] = (),
    points: bool = True,
    measured: Sequence[Path] = (),
    reuse: bool = False,
):
    """``ragen reproduce --all --quick`` of the side's own checkout on the probe specs (unless ``points`` is False:
    a probe of its paths alone), then the probe ``paths``' runs (:class:`SidePaths`) one after the other, their
    data root at ``work/run/data`` (the same path for both sides, then moved to ``work/<name>``), under coverage
    when asked (``coverage``: its data file; it measures the ``measured`` files alone, and does not run when there
    are none). The ``added`` findings (registered by this side alone) are left out of that and run last, each
    ``ragen reproduce NAME --quick`` into ``work/run/added`` (a finding that analyses another's runs, into the
    compared data root, where those runs are): their rows are not compared, but their code ran.

    With ``reuse``, a side already in ``work/<name>`` whose stamp (:func:`side_stamp`) equals this one's is kept
    instead of run again: a probe run again in the same folder (say after a fix to the new commit) runs its new side
    alone."""
    run = work / "run"
    paths = paths or SidePaths()
    specs = side.tree / "configs" / "findings"
    commands = _side_commands(run, side.tree, paths, added, points)
    target = work / name
    stamp = side_stamp(side, launcher, commands)
    if paths.servers:  # a stamp without servers stays the one earlier probes wrote
        stamp["servers"] = paths.servers
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
    prefix = [sys.executable]
    if coverage is not None and measured:
        prefix += ["-m", "coverage", "run", f"--rcfile={coverage_settings(coverage, measured)}"]
    with open(work / f"{name}.log", "w") as output:
        for what, args in commands.items():
            _run_command(side, launcher, prefix, what, args, paths.servers, output, work / name)
    if coverage is not None and measured:
        combine_measurements(coverage)
    side.seconds = round(time.monotonic() - started, 1)
    if target.exists():
        shutil.rmtree(target)
    run.rename(target)
    side.lake, side.out = target / "data", target / "out"
    atomic_write_bytes(target / SIDE_STAMP, json.dumps({**stamp, "seconds": side.seconds}, indent=1).encode())


def coverage_settings(coverage: Path, measured: Sequence[Path]) -> Path:
    """coverage.py's settings for a side (written beside its data file): the ``measured`` files alone, in the run's
    process and in every Python process it starts (``patch = subprocess``: the launched group's ranks, the sampler
    process, the vLLM server when its environment has coverage.py too), each writing a data file of its own beside
    ``coverage`` that :func:`combine_measurements` adds in; ``_exit`` and ``sigterm``: a process ending by
    ``os._exit`` or SIGTERM saves its data first."""
    include = "".join(f"\n    {path}" for path in measured)
    settings = coverage.with_suffix(".rc")
    settings.write_text(
        f"[run]\ndata_file = {coverage}\ninclude ={include}\npatch =\n    subprocess\n    _exit\nsigterm = true\n"
    )
    return settings


def combine_measurements(coverage: Path) -> None:
    """Add the data files of the side's child processes (``<coverage>.<host>.<pid>.<random>``) into ``coverage``; a
    child killed before it saved left none, and its lines count as not run."""
    done = subprocess.run(
        [sys.executable, "-m", "coverage", "combine", "--append", f"--data-file={coverage}", str(coverage.parent)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 and "No data to combine" not in done.stdout + done.stderr:
        raise RestampError(f"coverage could not combine the probe's measurements: {done.stderr.strip()[-300:]}")


def _run_command(
    side: Side,
    launcher: Path,
    prefix: list[str],
    what: str,
    args: list[str],
    servers: dict[str, list[str]],
    output: Any,
    name_path: Path,
) -> None:
    """One command of a side (its env server first, when its path declares one), its output into ``output``."""
    specs = side.tree / "configs" / "findings"
    if what.startswith("new finding "):  # back in place for its own run
        hidden = specs / f"{what.removeprefix('new finding ')}.added"
        hidden.rename(hidden.with_suffix(".yaml"))
    serve = servers.get(what.removeprefix("new ").removeprefix("probe path ")) if "probe path " in what else None
    server = None
    if serve:
        output.write(f"$ ragen env serve {' '.join(serve)}\n")
        output.flush()
        log = name_path.with_name(f"{name_path.name}-server.log")
        server = _start_server(
            [*prefix, str(launcher), str(side.tree), "env", "serve", *serve], side.tree, _child_env(side.tree), log
        )
    try:
        output.write(f"$ ragen {' '.join(args)}\n")
        output.flush()
        done = subprocess.run(
            [*prefix, str(launcher), str(side.tree), *args],
            cwd=side.tree,
            env=_child_env(side.tree),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        if server is not None:
            _stop_server(server)
    if done.returncode != 0:
        raise RestampError(
            f"the {name_path.name} side's runs failed in {what} (exit {done.returncode}); its output: {name_path}.log"
        )


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
    "SidePaths",
    "checkouts",
    "export_commit",
    "probe_overrides",
    "path_servers",
    "probe_paths",
    "run_side",
    "runs_of",
    "side_stamp",
    "spec_digests",
    "stamped_side",
    "write_probe_specs",
]
