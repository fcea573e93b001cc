"""The ``ragen`` command line: train, resume, retrain, sweep, eval, sql, plot, reproduce, runs (list, rm, compact),
server, export, upgrade-lake, config show, env serve."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from ragen_cli.common import (
    OVERRIDES,
    DataRoot,
    TrustEnvModule,
    Verbose,
    checked_run_id,
    config_option,
    console,
    data_root_path,
    fail,
    note,
    print_table,
    run_id_option,
    shown,
    writable_root,
)
from ragen_cli.config import config_app
from ragen_cli.entry import SHORT_HELP, app, run_app
from ragen_cli.envs import env_app
from ragen_cli.export import export, upgrade_lake
from ragen_cli.group import group_app
from ragen_cli.launch import (
    admitted,
    available_cores,
    overlap_hint,
    print_step,
    start_flow_command,
    user_facing_errors,
    watch_points,
    watch_run,
)
from ragen_cli.reading import plot, sql, view
from ragen_cli.reproduce import reproduce
from ragen_cli.rollout import rollout_app
from ragen_cli.runs import runs_app
from ragen_cli.server import server_app
from ragen_cli.summary import metrics_line, print_run_summary, print_sweep
from ragen_core.run.inputs import EvalInputs, ResumeInputs, RetrainInputs, TrainInputs

if TYPE_CHECKING:
    from ragen_core.run.procedures import Admission
    from ragen_core.storage import DataLake
    from ragen_core.sweep import SweepRequest
    from schemas.manifest import RunManifest

T = TypeVar("T")

app.add_typer(server_app, name="server", short_help=SHORT_HELP["server"])
app.add_typer(runs_app, name="runs", short_help=SHORT_HELP["runs"])
app.add_typer(config_app, name="config", short_help=SHORT_HELP["config"])
app.add_typer(env_app, name="env", short_help=SHORT_HELP["env"])
app.add_typer(group_app, name="group", short_help=SHORT_HELP["group"])
app.add_typer(rollout_app, name="rollout", short_help=SHORT_HELP["rollout"])
app.command(short_help=SHORT_HELP["reproduce"])(reproduce)
app.command(short_help=SHORT_HELP["export"])(export)
app.command("upgrade-lake", short_help=SHORT_HELP["upgrade-lake"])(upgrade_lake)


@app.command(context_settings=OVERRIDES, short_help=SHORT_HELP["train"])
def train(
    ctx: typer.Context,
    config: Path | None = config_option(),
    data_root: DataRoot = None,
    run_id: str | None = run_id_option(TrainInputs.describe("run_id")),
    verbose: Verbose = False,
) -> None:
    """Train with StarPO / StarPO-S. Extra arguments are key.sub=value overrides, e.g. trainer.iterations=5."""
    from ragen_core.run.requests import run_request

    root = data_root_path(data_root, "write")
    given = {"config": config, "data_root": root, "run_id": run_id, "overrides": ctx.args}
    request = built(lambda: run_request(TrainInputs.of(**given)))
    if config is None:  # `ragen train` typed to see what it does: say what it will train before it starts
        note(
            "no --config: training the built-in defaults (`ragen config show` lists them: Bandit, no bootstrap, "
            "so the untrained tiny model seldom ends its replies); the demo's is --config configs/bandit.yaml"
        )
    _run(ctx.with_resource(admitted(request)), verbose)


@app.command(context_settings=OVERRIDES, short_help=SHORT_HELP["resume"])
def resume(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., help=ResumeInputs.describe("run_id")),
    data_root: DataRoot = None,
    force_config: str = typer.Option(
        "", "--force-config", help="Comma-separated: " + ResumeInputs.describe("force_config")
    ),
    skip_iteration: bool = typer.Option(False, "--skip-iteration", help=ResumeInputs.describe("skip_iteration")),
    trust_env_module: TrustEnvModule = False,
    verbose: Verbose = False,
) -> None:
    """Continue a run from its last committed iteration, with the run's own config. Extra key.sub=value
    overrides change it (only the keys listed in --force-config), e.g. trainer.iterations=50."""
    from ragen_core.config import ConfigError
    from ragen_core.run.requests import refusals, resume_request
    from ragen_core.storage import DataLake

    allowed = [key.strip() for key in force_config.split(",") if key.strip()]
    given = {"run_id": run_id, "data_root": data_root_path(data_root, "write"), "overrides": ctx.args}
    given.update(force_config=allowed, skip_iteration=skip_iteration, trust_env_module=trust_env_module)
    inputs = built(lambda: ResumeInputs.of(**given))
    try:  # a manifest of the wrong shape (types, another run's id) is named, never a traceback
        request = resume_request(inputs)
    except ConfigError as exc:
        fail(with_recorded_code(str(exc), DataLake(inputs.data_root).read_manifest(run_id)))
    except refusals() as exc:
        fail(str(exc))
    _run(ctx.with_resource(admitted(request)), verbose)


@app.command(context_settings=OVERRIDES, short_help=SHORT_HELP["retrain"])
def retrain(
    ctx: typer.Context,
    sql: str = typer.Option(..., "--from", help=RetrainInputs.describe("sql")),
    mode: str = typer.Option("sft", "--mode", help=RetrainInputs.describe("mode")),
    init: str = typer.Option(..., "--init", help=RetrainInputs.describe("init")),
    config: Path | None = config_option("YAML config (actor, algorithm, offline, eval)."),
    data_root: DataRoot = None,
    run_id: str | None = run_id_option(RetrainInputs.describe("run_id")),
    verbose: Verbose = False,
) -> None:
    """Re-train a model offline on stored trajectories, exactly as stored (no re-tokenisation), as a new run whose
    manifest records the query and the source runs. Extra key.sub=value overrides, e.g. offline.epochs=3."""
    from ragen_core.run.requests import refusals, retrain_request

    given = {"config": config, "sql": sql, "init": init, "mode": mode, "data_root": data_root_path(data_root, "all")}
    # every refusal before anything is created: no lock, no Prefect home, no manifest, no rows
    request = built(lambda: retrain_request(RetrainInputs.of(**given, run_id=run_id, overrides=ctx.args)))
    admission = ctx.with_resource(admitted(request))
    start_flow_command(request.lake, request.run_id, verbose)
    from flows.retrain import retrain_admitted

    root = request.lake.root
    console.print(f"offline {mode} run [bold]{request.run_id}[/] from {shown(init)} · data root {shown(root)}")
    try:
        with watch_run(lambda i, m: console.print(metrics_line(i, m))):
            result = retrain_admitted(admission)
    except (*refusals(), *user_facing_errors()) as exc:
        fail(str(exc))
    console.print(f"trained on {result['trajectories']} stored trajectories")
    print_run_summary(request.lake, result["run_id"], None, phases=f"before -> after offline {mode.upper()}")


@app.command(context_settings=OVERRIDES, short_help=SHORT_HELP["sweep"])
def sweep(
    ctx: typer.Context,
    config: Path | None = config_option("Base YAML config."),
    grid: list[str] | None = typer.Option(
        None, "--grid", "-g", help='Grid axis key=[v1,v2,...] (repeatable), e.g. "algorithm.filter_ratio=[0.25,0.5]".'
    ),
    random: list[str] | None = typer.Option(
        None, "--random", help="Random axis key=dist(args) (repeatable): uniform, loguniform, randint, choice([..])."
    ),
    samples: int = typer.Option(0, "--samples", help="Random draws per grid combination (with --random)."),
    search_seed: int = typer.Option(0, "--search-seed", help="Seed of the random draws (part of the sweep id)."),
    seeds: str | None = typer.Option(None, "--seeds", help="Seeds per point: a count (3 -> 0,1,2) or a list 0,7,42."),
    sweep_id: str | None = typer.Option(None, "--sweep-id", help="Sweep id (default sweep-<hash of the spec>)."),
    point: list[int] | None = typer.Option(None, "--point", help="Run only this point index (repeatable)."),
    max_points: int | None = typer.Option(
        None, "--max-points", help="Refuse a search of more points than this (default 100): a guard against typos."
    ),
    deployment: bool = typer.Option(
        False, "--deployment", help="Submit each point as a run of a deployment (needs PREFECT_API_URL and a worker)."
    ),
    deployment_name: str = typer.Option("train/train", "--deployment-name", help="Deployment the points run as."),
    data_root: DataRoot = None,
    verbose: Verbose = False,
) -> None:
    """A sweep: every grid combination x random draw x seed is its own run (manifest: sweep id, point, overrides),
    then a comparison table. The same command again resumes it (completed points are skipped). Extra key.sub=value
    arguments override the base config of every point."""
    from ragen_core.sweep import DEFAULT_MAX_POINTS, SweepError, sweep_request

    checked_run_id(sweep_id, "sweep id")  # it prefixes the points' run ids
    max_points = DEFAULT_MAX_POINTS if max_points is None else max_points
    if deployment and "PREFECT_API_URL" not in os.environ:
        fail(
            "--deployment needs a Prefect server and a worker: run `make server` (or `ragen server start`) and "
            "export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    where = deployment_name if deployment else None
    request = built(
        lambda: sweep_request(
            config,
            data_root_path(data_root, "write"),
            grid,
            random,
            samples,
            seeds,
            sweep_id,
            list(ctx.args),
            where,
            point or None,
            search_seed,
            max_points=max_points,
        ),
        SweepError,
    )
    writable_root(request.lake.root)  # made and proven writable once every point's config passed
    start_flow_command(request.lake, request.sweep_id, verbose)
    from flows.sweep import sweep_requested

    _announce(request)
    try:
        with watch_points():
            result = sweep_requested(request)
    except SweepError as exc:
        fail(str(exc))
    print_sweep(result)


def _announce(request: SweepRequest) -> None:
    """The sweep's first lines: its id, the points it runs (each with its overrides), where and the data root."""
    chosen = request.chosen()
    where = f"deployment {request.deployment}" if request.deployment else "local subflows"
    console.print(
        f"sweep [bold]{request.sweep_id}[/] · {len(chosen)} of {len(request.plan.points)} point(s) · "
        f"{where} · {shown(request.lake.root)}"
    )
    for item in chosen:
        console.print(f"  {item.run_id}: {shown(' '.join(item.overrides) or '(base config)')}")


@app.command("eval", context_settings=OVERRIDES, short_help=SHORT_HELP["eval"])
def eval_command(
    ctx: typer.Context,
    target: str = typer.Argument(..., help=EvalInputs.describe("target")),
    env: list[str] | None = typer.Option(None, "--env", "-e", help="Repeatable. " + EvalInputs.describe("envs")),
    n: int | None = typer.Option(None, "--n", help=EvalInputs.describe("n")),
    config: Path | None = config_option(EvalInputs.describe("config")),
    data_root: DataRoot = None,
    run_id: str | None = run_id_option(EvalInputs.describe("run_id")),
    trust_env_module: TrustEnvModule = False,
    verbose: Verbose = False,
) -> None:
    """Evaluate a policy on fixed validation instances; the rollouts are stored as an evaluation run (query them with
    `ragen sql`). Extra key.sub=value overrides, e.g. eval.temperature=1.0 eval.k=4."""
    from ragen_core.run.evaluation import EvaluationError
    from ragen_core.run.requests import eval_request, refusals
    from ragen_core.storage import DataLake

    given = {"target": target, "data_root": data_root_path(data_root, "all"), "envs": env, "n": n, "config": config}
    inputs = built(
        lambda: EvalInputs.of(**given, overrides=ctx.args, run_id=run_id, trust_env_module=trust_env_module)
    )
    try:
        request = eval_request(inputs)
    except refusals() as exc:
        fail(with_recorded_code(str(exc), _target_manifest(DataLake(inputs.data_root), target)))
    lake = request.lake
    admission = ctx.with_resource(admitted(request))
    start_flow_command(lake, "eval", verbose)
    from flows.evaluate import evaluate_admitted

    console.print(f"evaluating [bold]{shown(request.which)}[/] · data root {shown(lake.root)}")
    try:
        with watch_run():
            result = evaluate_admitted(admission)
    except (EvaluationError, *user_facing_errors()) as exc:
        fail(str(exc))
    import pyarrow as pa

    note = " (stored result of the same evaluation)" if result["reused"] else ""
    console.print(f"evaluation run [bold]{result['run_id']}[/]{note}")
    print_table(pa.Table.from_pylist(result["evaluations"]))


def with_recorded_code(message: str, manifest: RunManifest | None) -> str:
    """``message``, and where the run's manifest says its env code came from when the message is about a module
    that cannot be imported or an env name no installed distribution registers any more
    (``ragen_core.run.record.recorded_code``)."""
    from ragen_core.run.record import recorded_code

    missing = "cannot import module" in message or "unknown environment" in message
    recorded = recorded_code(manifest) if missing and manifest is not None else ""
    return f"{message}; {recorded}" if recorded else message


def _target_manifest(lake: DataLake, target: str) -> RunManifest | None:
    """The manifest of the run ``ragen eval``'s target names, if it is a readable run's (else None)."""
    from ragen_core.storage import LakeError
    from ragen_core.storage.names import is_valid_run_id, split_run_ref

    run_id = split_run_ref(target)[0]
    try:
        return lake.read_manifest(run_id) if is_valid_run_id(run_id) and lake.root.is_dir() else None
    except LakeError:
        return None


def built(build: Callable[[], T], *errors: type[Exception]) -> T:
    """The request ``build`` makes (:mod:`ragen_core.run.requests`); an input its builder refuses
    (:func:`~ragen_core.run.requests.refusals`, and ``errors``) is a user error, one line before anything starts."""
    from ragen_core.run.requests import refusals

    try:
        return build()
    except (*refusals(), *errors) as exc:
        fail(str(exc))


def _run(admission: Admission, verbose: bool) -> None:
    """Run (or resume) an admitted training request through the train flow with a progress bar, then print the
    run's summary. A run the admission found done is answered before any Prefect server starts."""
    from ragen_core.run.decisions import Start

    request = admission.request
    lake, run_id = request.lake, request.run_id
    if admission.start is Start.DONE:
        from ragen_core.run.decisions import done_line
        from ragen_core.run.resume import record_done

        console.print(done_line(run_id, record_done(lake, run_id)))  # a stop after its last commit: recorded now
        result = {"run_id": run_id, "bootstrap": None}
    else:
        if hint := overlap_hint(request.config, available_cores(), os.getloadavg()[0]):
            note(hint)
        start_flow_command(lake, run_id, verbose)
        console.print(f"run [bold]{run_id}[/] · config {request.config.config_hash()} · data root {shown(lake.root)}")
        result = _train_with_progress(admission)
    if result.get("resumed"):
        resumed = result["resumed"]
        console.print(
            f"resumed at iteration {resumed['next_iteration']} from "
            f"{resumed['checkpoint'] or 'the start model'} (replayed updates: {resumed['replayed'] or 'none'})"
        )
    from ragen_core.storage import LakeError

    try:
        print_run_summary(lake, result["run_id"], result.get("bootstrap"))
    except LakeError as exc:  # a damaged file the run's summary reads: say so, never a traceback or a silent 0
        fail(f"the run's summary cannot be read: {exc}")


def _failed_extension(lake: DataLake, run_id: str, message: str) -> str:
    """The line for an extension that a want of space stopped: the space line's advice (resume the run) would find
    an undone extension's run completed, so it says what became of the run and names the command to run again."""
    head = message.split(": free space", 1)[0]
    again = shlex.join(["ragen", *sys.argv[1:]])
    manifest = lake.read_manifest(run_id)
    if manifest is not None and manifest.status == "completed":  # undone: the run as it was before the extension
        return (
            f"{head}: the extension was undone, run {run_id} is completed as it was; free space or raise the limit "
            f"(ulimit -f), then extend it again: `{again}`"
        )
    return f"{head}: free space or raise the limit (ulimit -f), then run the same command again: `{again}`"


def _train_with_progress(admission: Admission) -> dict:
    """The train flow under a progress bar; a user's error is one line, a Ctrl-C a one-line report (exit 130)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows.train import train_admitted
    from ragen_core.run.decisions import ResumeError, Start

    lake, run_id = admission.request.lake, admission.request.run_id
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    from ragen_core.run.record import utc_now

    started = utc_now()  # a want of space the manifest recorded before this command is not this failure's cause
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("training", total=admission.request.config.trainer.iterations + 1)

        def on_iteration(iteration: int, metrics: dict[str, float]) -> None:
            progress.console.print(metrics_line(iteration, metrics))
            progress.update(bar, completed=iteration + 1)

        try:
            with watch_run(on_iteration, lambda text: print_step(text, progress.console)):
                return train_admitted(admission)
        except (ResumeError, *user_facing_errors()) as exc:  # the manifest recorded it; one line, no traceback
            progress.stop()
            fail(str(exc))
        except BaseException as exc:  # Ctrl-C: the flow recorded where it stopped; one line, then exit status 130
            from ragen_cli.interrupts import note_stop, report_interrupted, requested
            from ragen_core.run.record import interrupted

            if not (interrupted(exc) or requested()):  # an error that a Ctrl-C did not cause: not ours to handle
                from ragen_core.storage.maintenance.space import space_failure

                message = space_failure(lake.root, run_id, exc, started)  # a full disk or a file-size limit: one line
                if message is None:
                    raise
                if admission.start is Start.EXTEND:
                    message = _failed_extension(lake, run_id, message)
                progress.stop()
                import logging

                logging.raiseExceptions = False  # Prefect's log sender, failing on the full disk too, stays quiet
                fail(message)
            progress.stop()
            note_stop(exc)  # a SIGTERM that Prefect caught first is still a SIGTERM (exit status 143)
            report_interrupted(lake, run_id)
            raise KeyboardInterrupt from None  # also for a library's error raised while it handled the Ctrl-C


# the commands that only read, listed after the others
app.command(short_help=SHORT_HELP["sql"])(sql)
app.command(short_help=SHORT_HELP["plot"])(plot)
app.command(short_help=SHORT_HELP["view"])(view)


def main() -> None:
    """The ``ragen`` entry point: the first Ctrl-C stops the command cleanly (exit status 130), a second forces it."""
    from ragen_cli import interrupts

    interrupts.install()
    try:
        status = run_app()
        if status:
            raise SystemExit(status)
    except BaseException:  # SystemExit, or an error a library raised from the interrupt it was handed
        if interrupts.requested():  # a command without its own message about the stop: one line, never a traceback
            interrupts.report(f"interrupted ({interrupts.signal_name()})")
            raise SystemExit(interrupts.exit_code()) from None
        raise


if __name__ == "__main__":
    main()
