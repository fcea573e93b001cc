"""The Python API: the ``ragen`` command's operations as functions, run in this process without Prefect.

Each function builds its command's request once (:mod:`ragen_core.run.requests`: the config validated, the run id
checked, the lake made), admits it (the run's writer lock taken, the start decided:
:func:`ragen_core.run.procedures.admit`) and runs the same procedure as the command's flow, each step called
directly (:func:`ragen_core.run.procedures.call_step`): a run trained here equals the same run trained by
``ragen train``, row for row and weight for weight. A config is a YAML path, a tree (dict) or a
:class:`~ragen_core.config.RunConfig`; ``overrides`` are ``key.sub=value`` texts. A refused input raises the
project's own error, one line that says what to fix: :class:`~ragen_core.config.ConfigError`,
:class:`~ragen_core.storage.LakeError` (a run id, the lake, another process writing the run),
:class:`~ragen_core.run.requests.RequestError`, :class:`~ragen_core.run.decisions.ResumeError`,
:class:`~ragen_core.run.evaluation.EvaluationError`, :class:`~ragen_core.sweep.SweepError`,
:class:`~ragen_core.run.offline.OfflineError`.

    import ragen_core

    run = ragen_core.train("configs/bandit.yaml", "data", overrides=["trainer.iterations=3"])
    frame = ragen_core.query("SELECT * FROM metrics WHERE run_id = ?", "data", params=[run.run_id], form="pandas")
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb

from ragen_core import sweep as s
from ragen_core.run import procedures as p
from ragen_core.run import requests as q
from ragen_core.run.entry import run_lake
from ragen_core.storage import DataLake, LakeError, QueryError
from ragen_core.storage import query as lake_query
from ragen_core.storage.names import validate_run_id
from ragen_core.storage.statements import one_line

Progress = Callable[[int, dict[str, float]], None]
Step = Callable[[str], None]
Form = Literal["arrow", "pandas", "duckdb"]
FORMS = ("arrow", "pandas", "duckdb")
FINAL_STATES = ("COMPLETED", "FAILED")  # a sweep point's outcome, as Prefect's state types spell them


@dataclass(frozen=True)
class RunResult:
    """A run's outcome: its id, its manifest's status (``completed``; ``failed`` / ``interrupted`` only when read
    back), its final validation (the ``val/...`` metrics of its last committed iteration), where it lies (``run_dir``,
    the newest ``checkpoint`` folder or None) and what the procedure reported (``details``: ``resumed``,
    ``completed`` for a run that was done already, ``bootstrap``, ``trajectories`` ...)."""

    run_id: str
    status: str
    validation: dict[str, float]
    data_root: Path
    run_dir: Path
    checkpoint: Path | None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EvalResult(RunResult):
    """An evaluation run's outcome: a :class:`RunResult` plus its rows of the ``evaluations`` table (one per env:
    success rate, pass@k, mean reward) and whether it was stored before (``reused``)."""

    evaluations: list[dict[str, Any]] = field(default_factory=list)
    reused: bool = False


@dataclass(frozen=True)
class SweepResult:
    """A sweep's outcome: its id, the data root and its comparison table (a row per point: run id, overrides,
    status, outcome, validation success before RL and last, final reward, collapse events)."""

    sweep_id: str
    data_root: Path
    points: list[dict[str, Any]]


def _hooks(progress: Progress | None, step: Step | None) -> p.Hooks:
    """The direct hooks, with the caller's ``progress`` and ``step`` where given."""
    given = {"report": progress, "step": step}
    return p.Hooks(**{name: hook for name, hook in given.items() if hook is not None})


def _result(lake: DataLake, run_id: str, details: dict[str, Any]) -> RunResult:
    """What the lake holds of ``run_id`` now (its manifest, its last committed iteration's validation)."""
    manifest = lake.read_manifest(run_id)
    committed = lake.committed_iterations(run_id)
    validation = {}
    if committed:
        rows = lake.read_table("metrics", run_id, iteration=committed[-1], columns=["name", "value"]).to_pylist()
        validation = {row["name"]: row["value"] for row in rows if row["name"].startswith("val/")}
    checkpoints = lake.list_checkpoints(run_id)
    return RunResult(
        run_id,
        manifest.status if manifest else "absent",
        validation,
        Path(lake.root).resolve(),
        lake.run_dir(run_id),
        checkpoints[-1][1] if checkpoints else None,
        details,
    )


def run(request: q.RunRequest, progress: Progress | None = None, step: Step | None = None) -> RunResult:
    """Train (or go on with) the run of a built ``request`` (:func:`ragen_core.run.requests.run_request`)."""
    with p.admit(request) as admission:
        details = p.train(admission, _hooks(progress, step))
    return _result(request.lake, request.run_id, details)


def train(
    config: q.ConfigInput = None,
    data_root: str | Path | DataLake = "data",
    run_id: str | None = None,
    overrides: list[str] | None = None,
    force_config: list[str] | None = None,
    skip_iteration: bool = False,
    progress: Progress | None = None,
    step: Step | None = None,
) -> RunResult:
    """Train one run, as ``ragen train``: [bootstrap] -> ``trainer.iterations`` iterations -> final validation. An
    existing ``run_id`` goes on from its last committed iteration (the same config, unless ``force_config`` lists the
    keys allowed to differ); a completed one is returned as it is. ``progress(iteration, metrics)`` hears of each
    committed iteration, ``step(text)`` of each long step."""
    given = dict(config=config, data_root=data_root, run_id=run_id, overrides=overrides, force_config=force_config)
    request = q.run_request(q.TrainInputs.of(**given, skip_iteration=skip_iteration))
    return run(request, progress, step)


def resume(
    run_id: str,
    data_root: str | Path | DataLake = "data",
    overrides: list[str] | None = None,
    force_config: list[str] | None = None,
    skip_iteration: bool = False,
    trust_env_module: bool = False,
    progress: Progress | None = None,
    step: Step | None = None,
) -> RunResult:
    """Go on with a stored run with its own config, as ``ragen resume``: ``overrides`` change the keys
    ``force_config`` allows (``trainer.iterations=50`` extends a completed run); ``trust_env_module`` lets the stored
    config import the modules it names."""
    given = dict(run_id=run_id, data_root=data_root, overrides=overrides, force_config=force_config)
    request = q.resume_request(
        q.ResumeInputs.of(**given, skip_iteration=skip_iteration, trust_env_module=trust_env_module)
    )
    return run(request, progress, step)


def evaluate(
    target: str,
    data_root: str | Path | DataLake = "data",
    envs: list[str] | None = None,
    n: int | None = None,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    trust_env_module: bool = False,
    progress: Progress | None = None,
    step: Step | None = None,
) -> EvalResult:
    """Evaluate a policy on fixed validation instances, as ``ragen eval``: ``target`` is a run id (its newest
    checkpoint; ``RUN_ID@N``: the one after N updates), a checkpoint folder or a model folder; ``envs``/``n`` the
    validation envs and instances. Stored as its own run; the same evaluation again returns the stored result."""
    given = dict(target=target, data_root=data_root, envs=envs, n=n, config=config, overrides=overrides)
    request = q.eval_request(q.EvalInputs.of(**given, run_id=run_id, trust_env_module=trust_env_module))
    with p.admit(request) as admission:
        details = p.evaluate(admission, _hooks(progress, step))
    base = _result(request.lake, request.run_id, details)
    return EvalResult(**base.__dict__, evaluations=details["evaluations"], reused=details["reused"])


def retrain(
    config: q.ConfigInput,
    sql: str,
    init: str,
    data_root: str | Path | DataLake = "data",
    mode: str = "sft",
    run_id: str | None = None,
    overrides: list[str] | None = None,
    progress: Progress | None = None,
    step: Step | None = None,
) -> RunResult:
    """Re-train a model offline on the stored trajectories ``sql`` selects, as ``ragen retrain``: ``mode`` sft or pg,
    ``init`` a model or checkpoint folder, ``run:<id>`` or ``run:<id>@<updates>``; ``offline.epochs`` epochs, each
    committed as an iteration, validated before and after."""
    given = dict(config=config, sql=sql, init=init, mode=mode, data_root=data_root, run_id=run_id)
    request = q.retrain_request(q.RetrainInputs.of(**given, overrides=overrides))  # every refusal, nothing created
    with p.admit(request) as admission:
        details = p.retrain(admission, _hooks(progress, step))
    return _result(request.lake, request.run_id, details)


def sweep(
    config: q.ConfigInput = None,
    data_root: str | Path | DataLake = "data",
    grid: list[str] | None = None,
    random: list[str] | None = None,
    samples: int = 0,
    seeds: int | str | list[int] | None = None,
    sweep_id: str | None = None,
    overrides: list[str] | None = None,
    points: list[int] | None = None,
    search_seed: int = 0,
    max_points: int | None = None,
    progress: Progress | None = None,
    step: Step | None = None,
) -> SweepResult:
    """A sweep, as ``ragen sweep`` with local points: every grid combination (``key=[v1,v2]``) x random draw
    (``key=dist(args)``, ``samples`` per combination) x seed is its own run, one after the other; a failing point is
    recorded and the sweep goes on. The same sweep again resumes it (completed points are skipped)."""
    extra = {} if max_points is None else {"max_points": max_points}
    request = s.sweep_request(
        config, data_root, grid, random, samples, seeds, sweep_id, overrides, None, points, search_seed, **extra
    )

    def run_points(chosen: list[s.SweepPoint]) -> dict[str, str]:
        outcomes = {}
        for point in chosen:
            entry = point.manifest_entry(request.sweep_id)
            inputs = q.TrainInputs.of(config=point.config, data_root=request.lake, run_id=point.run_id, sweep=entry)
            point_request = q.run_request(inputs)
            try:
                run(point_request, progress, step)
            except Exception:  # a failing point is recorded (its manifest says how it ended) and the sweep goes on
                outcomes[point.run_id] = FINAL_STATES[1]
            else:
                outcomes[point.run_id] = FINAL_STATES[0]
        return outcomes

    result = s.run_sweep(request, run_points)
    return SweepResult(result["sweep_id"], Path(result["data_root"]), result["points"])


def query(
    sql: str,
    data_root: str | Path | DataLake = "data",
    run_id: str | None = None,
    params: list | dict | None = None,
    form: Form = "arrow",
    timeout: float | None = None,
    memory_limit: str | None = "4GB",
) -> Any:
    """One read-only SQL query over the lake's tables (docs/sql.md), as ``ragen sql``: every run, or only
    ``run_id``; ``params`` bind ``?`` / ``$name`` placeholders. The result as an Arrow table, a pandas DataFrame or
    a DuckDB relation (``form``). A query that DuckDB cannot run raises
    :class:`~ragen_core.storage.running.QueryError` (a ``LakeError``) in one line, DuckDB's kind of error in its
    ``kind``; one still running after ``timeout`` seconds is stopped (``QueryTimeout``); ``memory_limit`` bounds its
    operators' memory (DuckDB's ``memory_limit``; None: DuckDB's default, 80% of the machine's)."""
    lake = _existing(data_root)
    try:
        table = lake_query(lake, sql, run_id=run_id, params=params, timeout=timeout, memory_limit=memory_limit)
    except duckdb.Error as exc:
        raise QueryError(one_line(str(exc)), type(exc).__name__) from None
    return _in_form(table, form)


def runs(data_root: str | Path | DataLake = "data", form: Form = "arrow") -> Any:
    """The runs of a data root, as ``ragen runs``: a row per run (kind, status, config hash, committed iterations,
    the last validation success, created_at; docs/usage.md says what each number means). A manifest that cannot be
    read is a row with status ``broken`` (the others stay listed). Reads the lake only."""
    from ragen_core.storage.maintenance import runs_overview

    return _in_form(runs_overview(_existing(data_root)), form)


def plot(run_ids: str | list[str], out: str | Path, data_root: str | Path | DataLake = "data", force: bool = False):
    """Draw the runs' collapse indicators into one PNG at ``out`` (outside the data root; an existing file only with
    ``force``), as ``ragen plot``: validation success per env, reward mean and std, in-group reward std, entropy,
    gradient norm and response length against the iteration. Returns a
    :class:`~ragen_core.monitor.plots.PlotResult` (``path``, the plotted ``data``, the matplotlib ``figure``); an
    unknown run or a bad ``out`` raises :class:`~ragen_core.monitor.plots.PlotError`."""
    from ragen_core.monitor.plots import plot_runs

    return plot_runs(_existing(data_root), _ids(run_ids), Path(out), force)


def export(
    run_ids: str | list[str],
    out: str | Path,
    data_root: str | Path | DataLake = "data",
    tables: list[str] | None = None,
    trust_env_module: bool = False,
    model: bool = False,
    merge: bool = False,
):
    """Write runs' rows as a Hugging Face dataset folder at ``out`` (new or empty, outside the data root), as ``ragen
    export``: splits train and validation of each table in ``tables`` (default ``trajectories``; several: a folder
    per table), committed iterations only, and a README with the exact chat that prompts each run's policy (a run of
    an env or reward of the user's own code only with ``trust_env_module``, which imports the modules its stored
    config names, as ``--trust-env-module``); with ``model``, each run's policy (its newest checkpoint's Hugging
    Face folder, or a LoRA run's adapters) copied to ``models/<run id>/``, as ``--model``; with ``merge`` too, a
    LoRA run's adapters merged into its start model there, a whole Hugging Face folder (``--merge``). Returns the
    :class:`~ragen_core.storage.maintenance.export.ExportReport` (rows per table and split, the folders, the
    iterations left out, each run's policy folder); a bad request raises its ``ExportError`` (a ``LakeError``)
    before anything is written."""
    from ragen_core.run.chat import export_notes
    from ragen_core.storage.maintenance.export import check_export, export_dataset, exported_model_dir, policy_folders

    lake, ids, chosen = (
        _existing(data_root, None if model else "read"),
        _ids(run_ids),
        list(tables or ["trajectories"]),
    )
    if merge and not model:
        raise LakeError("--merge writes each LoRA run's merged model into the export: give --model with it")
    check_export(lake, Path(out), ids, chosen)  # a bad request is refused before the README's notes are built
    trusted = frozenset({"module"}) if trust_env_module else frozenset()
    policies = policy_folders(lake, ids)  # looked up once: the README names the copies --model makes of them
    copies = {run_id: exported_model_dir(run_id) for run_id in policies} if model else None
    with tempfile.TemporaryDirectory(prefix=".ragen-merge-", dir=Path(out).resolve().parent) as scratch:
        merged = _merged_policies(lake, ids, Path(scratch)) if merge else {}  # before anything is written at out
        notes = export_notes(lake, ids, trusted, copies, Path(out).resolve(), merged=set(merged))
        report = export_dataset(lake, Path(out), ids, chosen, notes.markdown, model, {**policies, **merged})
    report.chats_left_out = notes.left_out
    return report


def _merged_policies(lake: DataLake, run_ids: list[str], scratch: Path) -> dict[str, Path]:
    """Each LoRA run's adapters (its newest checkpoint's) merged into the start model of its run, written under
    ``scratch``: the folders ``--merge`` exports in place of the adapters. The start model is read as ``--init``
    reads it: inside the data root or a trusted folder only."""
    from ragen_core.policy import PolicyLoadError
    from ragen_core.policy.lora import write_merged
    from ragen_core.run.offline import OfflineError, resolve_init
    from ragen_core.storage.maintenance.export import ExportError, adapter_runs

    merged = {}
    for run_id in adapter_runs(lake, run_ids):
        try:
            start = resolve_init(f"run:{run_id}@{lake.latest_checkpoint(run_id)[0]}", lake)
        except OfflineError as exc:
            raise ExportError(f"--merge: {exc}") from None
        merged[run_id] = scratch / run_id
        try:
            write_merged(start.model_dir, start.adapter, merged[run_id])
        except PolicyLoadError as exc:
            raise ExportError(f"--merge: run {run_id!r}: {exc}") from None
    return merged


def describe_config(config: q.ConfigInput = None, overrides: list[str] | None = None) -> list:
    """Every key of the config that ``config`` (a YAML path, a tree or a ``RunConfig``; None: the defaults) and
    ``overrides`` give, as ``ragen config show``: a :class:`~ragen_core.config.describe.KeyDoc` per key (``key``
    dotted as overrides name it, ``value``, ``default``, ``description``). Reads no data root; a bad key or value
    raises the ``ConfigError`` ``ragen train`` would."""
    from ragen_core.config.describe import describe_keys

    return describe_keys(q.resolve_config(config, overrides))


def _existing(data_root: str | Path | DataLake, only: str | None = "read") -> DataLake:
    """The lake of a data root an operation only reads: it must exist (a read creates nothing; a bucket's local
    copy holds what the tables need, or everything with ``only=None``)."""
    lake = run_lake(data_root, only)
    if not Path(lake.root).is_dir():
        raise LakeError(f"data root {str(lake.root)!r} does not exist; train first, or name your runs' data root")
    return lake


def _ids(run_ids: str | list[str]) -> list[str]:
    """One run id or several, each checked as a name (never a pattern or a path)."""
    ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)
    for run_id in ids:
        validate_run_id(run_id)
    return ids


def _in_form(table: Any, form: Form) -> Any:
    """An Arrow table as asked: itself, a pandas DataFrame or a DuckDB relation."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, not {form!r}")
    if form == "pandas":
        return table.to_pandas()
    if form == "duckdb":
        import duckdb

        return duckdb.from_arrow(table)
    return table


__all__ = [
    "EvalResult",
    "RunResult",
    "SweepResult",
    "describe_config",
    "evaluate",
    "export",
    "plot",
    "query",
    "resume",
    "retrain",
    "run",
    "runs",
    "sweep",
    "train",
]
