"""``ragen reproduce NAME``: run one of the paper's findings (a registered spec under configs/findings/) as sweeps of
local subflows, like ``ragen sweep``, then compute its numbers from the lake and draw its picture."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from ragen_cli.common import DataRoot, Verbose, console, data_root_path, fail, writable_root

if TYPE_CHECKING:
    from ragen_core.storage import DataLake

QUICK_HELP = "A tiny version (a few iterations) for tests and smoke runs; its runs and picture are kept apart."
RESTAMP_HELP = (
    "Prove that the commit checked out moves no committed finding's number (the first iterations of "
    "every point, old code and new, compared bit for bit) and write the record (docs/findings.md)."
)

FROM_HELP = "With --restamp: the commit whose code made the numbers (default: the findings' own)."
WORK_DIR_HELP = (
    "With --restamp: the probe's folder (default a new temporary one, removed after). Run again in the same folder, "
    "a probe keeps the old side it already ran when nothing it depends on changed."
)


def reproduce(
    name: str | None = typer.Argument(None, help="A registered finding (`ragen reproduce --list`)."),
    list_findings: bool = typer.Option(False, "--list", help="List the registered findings and their claims."),
    every: bool = typer.Option(False, "--all", help="Every registered finding, one after another, into --out-dir."),
    out: Path | None = typer.Option(None, "--out", "-o", help="PNG to write (default <out-dir>/<name>.png)."),
    out_dir: Path | None = typer.Option(
        None,
        "--out-dir",
        help="Folder of the pictures and numbers (default ./findings; the committed ones: --out-dir docs/findings).",
    ),
    quick: bool = typer.Option(False, "--quick", help=QUICK_HELP),
    restamp: bool = typer.Option(False, "--restamp", help=RESTAMP_HELP),
    from_commit: str | None = typer.Option(None, "--from", help=FROM_HELP),
    work_dir: Path | None = typer.Option(None, "--work-dir", help=WORK_DIR_HELP),
    data_root: DataRoot = None,
    verbose: Verbose = False,
) -> None:
    """Reproduce one of the paper's findings at tiny scale: its runs (resumed when already there), its numbers
    (printed, and written to <out>.json) and its picture (<out>). With --all, every registered finding: the code
    version recorded in each JSON is the checkout's as the command started, so the files it writes do not count as
    changes to the code that made them."""
    from ragen_core.findings import FindingError, claims, registered
    from ragen_core.findings.provenance import machine, provenance
    from ragen_core.findings.spec import REPO_ROOT

    if restamp or from_commit is not None or work_dir is not None:
        alone = name is None and not (every or quick or list_findings) and out is None and out_dir is None
        _restamp(restamp, alone, from_commit, work_dir)
        return
    if list_findings:
        for known, claim in claims().items():
            console.print(f"[bold]{known}[/]: {escape(claim)}", highlight=False)
        return
    if every == (name is not None):
        fail("give the NAME of a finding or --all; `ragen reproduce --list` lists them")
    if out is not None and every:
        fail("--out names one finding's picture; with --all give --out-dir")
    names = list(registered()) if every else [str(name)]
    folder = out_dir or Path("findings")  # the committed findings only when asked: --out-dir docs/findings
    made = {**provenance(REPO_ROOT), "cpu": machine()}  # before anything is written: the code that runs, not the
    # files this command writes; and the machine kind its numbers are bitwise on
    root = data_root_path(data_root, "write")  # a bucket: its local copy (the points commit into the bucket)
    try:
        jobs = [(n, *_planned(n, quick), _checked_out(_out(n, quick, folder, out), root)) for n in names]
    except FindingError as exc:  # every name checked before any compute
        fail(str(exc))
    from ragen_core.storage import DataLake

    lake = DataLake(writable_root(root))
    for finding, spec, plans, digest, path in jobs:
        started = time.monotonic()
        _run_sweeps(plans, lake, f"reproduce-{finding}", verbose)
        result = _analyse(spec, plans, lake, quick, {"spec_digest": digest, **made})
        result["wall_seconds"] = round(time.monotonic() - started, 1)
        _write(result, path)
        _print_numbers(result["numbers"])
        console.print(
            f"wrote {escape(str(path))} and {escape(str(path.with_suffix('.json')))} ({result['wall_seconds']:.0f} s)",
            highlight=False,
        )


def _planned(name: str, quick: bool) -> tuple[Any, list, str]:
    """The finding's spec, its sweeps and its digest, as the checkout stands before any compute."""
    from ragen_core.findings import load_finding, plan_finding, run_spec
    from ragen_core.findings.spec import spec_digest

    spec = load_finding(name)
    return spec, plan_finding(run_spec(spec), quick), spec_digest(spec)


def _out(name: str, quick: bool, folder: Path, out: Path | None) -> Path:
    return out or folder / f"{name}{'-quick' if quick else ''}.png"


def _checked_out(out: Path, root: Path) -> Path:
    """The picture's path: a .png outside the data root, not a folder (checked before any compute)."""
    from ragen_core.monitor.plots import PlotError, check_png_output

    try:
        return check_png_output(out, root)
    except PlotError as exc:
        fail(str(exc))


def _completed(plans: list, lake: DataLake) -> bool:
    """Whether every point of every sweep has a completed run already, its sweep recorded with the same spec: the
    sweeps would run nothing (so no flow, and no Prefect server, is started for them)."""
    from ragen_core.storage import LakeError
    from ragen_core.sweep import sweep_file

    for item in plans:
        path = sweep_file(lake, item.plan.sweep_id)
        try:
            if not path.is_file() or json.loads(path.read_text()).get("spec") != item.plan.spec:
                return False
            manifests = [lake.read_manifest(point.run_id) for point in item.plan.points]
        except (LakeError, OSError, ValueError):  # the sweep flow says what is wrong with them
            return False
        if any(m is None or m.status != "completed" for m in manifests):
            return False
    return True


def _run_sweeps(plans: list, lake: DataLake, name: str, verbose: bool) -> None:
    """Every variant's sweep as local subflows; completed points are skipped, failed ones resumed. When every point
    has completed, nothing is started: the numbers are read from the lake."""
    from ragen_core.storage.storecopy import root_address

    where = escape(root_address(lake.root))  # a bucket's URL, not its local copy's folder
    if _completed(plans, lake):
        points = sum(len(item.plan.points) for item in plans)
        console.print(f"{name.removeprefix('reproduce-')}: its {points} run(s) completed in {where}")
        return
    from ragen_cli.launch import start_flow_command, watch_points

    start_flow_command(lake, name, verbose)
    from flows.sweep import sweep_requested
    from ragen_core.sweep import sweep_request

    failed = []
    for item in plans:
        plan = item.plan
        console.print(f"sweep [bold]{plan.sweep_id}[/] · {len(plan.points)} point(s) · {where}")
        with watch_points():
            grid = [f"{k}={json.dumps(v)}" for k, v in plan.spec["grid"]]
            request = sweep_request(
                item.base, lake, grid, seeds=plan.spec["seeds"] or None, sweep_id=plan.sweep_id, plan=plan
            )
            result = sweep_requested(request)
        failed += [row["run_id"] for row in result["points"] if row["status"] != "completed"]
    if failed:
        console.print(f"[yellow]not completed:[/] {', '.join(failed)}; run the same command again to resume them")
        raise typer.Exit(code=1)


def _analyse(spec, plans: list, lake: DataLake, quick: bool, made: dict[str, Any]) -> dict[str, Any]:
    """The finding's JSON: what it is, its sweeps, its numbers and the held-out report, and ``made`` (its digest and
    the code and library versions, taken before its runs)."""
    from ragen_core.findings import ANALYSES, load_context
    from ragen_core.findings.analysis import held_out_report

    context = load_context(lake, spec, plans)
    return {
        "finding": spec.name,
        "claim": spec.claim,
        "analysis": spec.analysis,
        "quick": quick,
        "command": f"ragen reproduce {spec.name}{' --quick' if quick else ''}",
        "sweeps": {item.variant.name: item.plan.sweep_id for item in plans},
        "numbers": ANALYSES[spec.analysis](context),
        "held_out": held_out_report(context),
        **made,
    }


def _write(result: dict[str, Any], out: Path) -> None:
    from ragen_core.findings.figures import write_finding_png
    from ragen_core.storage.files import atomic_write_bytes

    try:
        atomic_write_bytes(out.with_suffix(".json"), (json.dumps(result, indent=1, default=str) + "\n").encode())
        write_finding_png(result, f"{result['finding']}: {result['claim']}", out)
    except OSError as exc:
        fail(f"cannot write {str(out)!r}: {exc.strerror or exc}")


def _fmt(value: dict[str, Any]) -> str:
    if value.get("mean") is None:
        return "no data"
    return f"{value['mean']:.3f} ± {value['std']:.3f} (min {value['min']:.3f}, max {value['max']:.3f}, n {value['n']})"


def _print_numbers(numbers: dict[str, Any]) -> None:
    """Every per-arm summary (mean ± std over seeds) and the top-level scalar results."""
    for label, arm in numbers.get("arms", {}).items():
        console.print(f"[bold]{escape(label)}[/]", highlight=False)
        for key, value in arm.items():
            if isinstance(value, dict) and "mean" in value:
                console.print(f"  {key}: {_fmt(value)}", highlight=False)
            elif isinstance(value, int | float | str):
                console.print(f"  {key}: {escape(str(value))}", highlight=False)
            elif key == "references":
                levels = ", ".join(f"{name} {level:.3f}" for name, level in value.items())
                console.print(f"  {key}: {escape(levels)}", highlight=False)
    for key in ("as_run", "calibrated"):
        if isinstance(numbers.get(key), dict):
            shown = {
                k: (_fmt(v) if isinstance(v, dict) and "mean" in v else v)
                for k, v in numbers[key].items()
                if not isinstance(v, dict) or "mean" in v
            }
            console.print(f"[bold]{key}[/]: {escape(json.dumps(shown, default=str))}", highlight=False)


def _restamp(restamp: bool, alone: bool, from_commit: str | None, work_dir: Path | None) -> None:
    """``ragen reproduce --restamp``: probe the findings' commit against HEAD and write the record when it holds."""
    if not restamp:
        fail("--from and --work-dir go with --restamp")
    if not alone:
        fail("--restamp probes every finding on its own: give it no NAME, --all, --list, --quick, --out or --out-dir")
    from_commit, work = _restamp_start(from_commit, work_dir)
    if from_commit is not None:
        _restamp_probe(from_commit, work, keep=work_dir is not None)


def _restamp_start(from_commit: str | None, work_dir: Path | None) -> tuple[str | None, Path]:
    """The commit to probe from (None when the findings already hold for this checkout) and the probe's folder."""
    import tempfile

    from ragen_core.findings import registered
    from ragen_core.findings.provenance import code_fingerprint, code_version
    from ragen_core.findings.restamp import reaches, stamped_commit
    from ragen_core.findings.spec import REPO_ROOT

    here = code_version(REPO_ROOT)
    if here["commit"] is None:
        fail("--restamp needs the project's git checkout (it runs the findings' commit beside HEAD)")
    if here["dirty"]:
        fail("the checkout has uncommitted changes: commit them first (a record vouches for commits)")
    head = code_fingerprint(REPO_ROOT)
    if from_commit is None:
        made = {(m["code"]["fingerprint"], m["code"]["commit"]) for m in _committed(REPO_ROOT, registered())}
        if len(made) != 1:
            fail(f"the committed findings were made by {len(made)} commits; name the one to probe with --from")
        fingerprint, commit = made.pop()
        if reaches(fingerprint, head, REPO_ROOT) is not None:
            console.print(f"the committed findings already hold for this checkout's code (fingerprint {head})")
            return None, Path()
        from_commit = stamped_commit(REPO_ROOT, fingerprint, commit)
    return from_commit, work_dir or Path(tempfile.mkdtemp(prefix="ragen-restamp-"))


def _restamp_probe(from_commit: str, work: Path, keep: bool) -> None:
    """Run the probe from ``from_commit`` to HEAD in ``work``; write the record, or say what differs."""
    import shutil

    from ragen_core.findings.bitwise import ComparisonError
    from ragen_core.findings.provenance import code_fingerprint
    from ragen_core.findings.restamp import RestampError, probe, record_of, record_path
    from ragen_core.findings.spec import REPO_ROOT
    from ragen_core.storage.files import atomic_write_bytes

    head = code_fingerprint(REPO_ROOT)
    try:
        result = probe(REPO_ROOT, from_commit, "HEAD", work, log=lambda line: console.print(escape(line)))
    except (RestampError, ComparisonError) as exc:
        fail(str(exc))
    if not result.passed:
        for line in result.problems():
            console.print(f"[red]refused:[/] {escape(line)}", highlight=False)
        fail(
            f"not re-stamped: {len(result.problems())} finding(s) above (the probe's folder: {work}); "
            "regenerate the findings (ragen reproduce --all --out-dir docs/findings), or fix the change and run "
            f"ragen reproduce --restamp --from {from_commit} --work-dir {work} (its old side is kept)"
        )
    record = record_of(result)
    path = record_path(REPO_ROOT, record)
    atomic_write_bytes(path, (json.dumps(record, indent=1) + "\n").encode())
    for table in result.tables:
        console.print(escape(table.summary()), highlight=False)
    console.print(
        f"wrote {escape(str(path.relative_to(REPO_ROOT)))}: {result.old.fingerprint} -> {head} "
        f"({result.seconds:.0f} s); commit it",
        highlight=False,
    )
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def _committed(root: Path, names) -> list[dict[str, Any]]:
    """The committed findings' JSONs (those that exist)."""
    folder = root / "docs" / "findings"
    return [json.loads((folder / f"{n}.json").read_text()) for n in names if (folder / f"{n}.json").is_file()]
