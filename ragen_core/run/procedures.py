"""What each command does once its request is built: ``train``, ``evaluate`` and ``retrain``, the same code whether
the Prefect flows call it (each step a Prefect task, progress shown in Prefect's UI and the terminal) or the Python
API does (:mod:`ragen_core.api`: each step a plain call).

Before a procedure runs, :func:`admit` takes the run's writer lock (one process writes a run at a time) and, for
training, decides how the run starts: fresh, over again, resumed, extended or already done. A procedure receives
that admission and a :class:`Hooks` (how to call each step, where progress goes); it does not validate a config,
make a lake, take a lock or decide the start again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ragen_core.run import bootstrap, offline, resume, session
from ragen_core.run.clock import run_name
from ragen_core.run.decisions import ResumePlan, Start, done_line, resume_line
from ragen_core.run.entry import OpenRun, open_run
from ragen_core.run.iteration import Call, IterationState, direct, run_iteration
from ragen_core.run.overlap import run_iterations
from ragen_core.run.record import RunRecord, check_run_id_free, new_manifest, run_status
from ragen_core.run.requests import EvalRequest, RetrainRequest, RunRequest
from ragen_core.run.session import RunSession
from ragen_core.run.stages import COMMIT, EVALUATION, FINAL_VALIDATION
from schemas.manifest import RunManifest

Request = RunRequest | EvalRequest | RetrainRequest


def _quiet(*_: Any) -> None:
    """A hook that hears nothing."""


class Unpublished:
    """The iteration artifacts of a run without Prefect: nothing to publish, nothing to wait for."""

    def publish(self, run_id: str, iteration: int, metrics: dict[str, float]) -> None:
        """Nothing."""

    def wait(self, raise_error: bool = True) -> None:
        """Nothing."""


@dataclass(frozen=True)
class SessionStep:
    """A step of a command outside an iteration's table (the model to start from, the bootstrap, opening or
    restoring the session, an offline epoch): the run layer's function, and the name a Prefect task run of it
    takes (a template over the function's parameters; the function's name when None)."""

    function: Callable[..., Any]
    run_name: str | None = None

    @property
    def name(self) -> str:
        return self.function.__name__


# Every session step, one row each: a procedure calls them by name (``hooks.steps.open_session(...)``), the flows
# as Prefect tasks through one wrapper (tasks/stages.py). A new step is its function and a row here.
SESSION_STEPS = (
    SessionStep(session.base_model_dir),
    SessionStep(bootstrap.bootstrap_model),
    SessionStep(session.open_session),
    SessionStep(resume.prepare_resume),
    SessionStep(resume.prepare_extension),
    SessionStep(resume.reopen_final_evaluation),
    SessionStep(resume.restore_session),
    SessionStep(resume.skip_iteration, run_name("skip")),
    SessionStep(offline.lineage),
    SessionStep(offline.offline_epoch, "epoch-i{epoch}"),
)

StepCall = Callable[..., Any]  # (step, *args, **kwargs) -> the step's result


def call_step(step: SessionStep, *args: Any, **kwargs: Any) -> Any:
    """A session step called directly (the Python API)."""
    return step.function(*args, **kwargs)


class Steps:
    """A table of session steps by name, each called through ``call``: ``Steps(SESSION_STEPS, call).open_session(
    config, lake, ...)`` is ``call(<open_session's row>, config, lake, ...)``. A name not in the table is an
    AttributeError."""

    def __init__(self, table: tuple[SessionStep, ...] = SESSION_STEPS, call: StepCall = call_step) -> None:
        names = [step.name for step in table]
        if len(set(names)) != len(names):
            raise ValueError(f"two session steps share a name: {sorted(names)}")
        self._table, self._call = {step.name: step for step in table}, call

    def __getattr__(self, name: str) -> Callable[..., Any]:
        table = self.__dict__.get("_table", {})
        if name not in table:
            raise AttributeError(f"no session step {name!r}; the steps: {', '.join(table)}")
        return partial(self._call, table[name])


@dataclass(frozen=True)
class Hooks:
    """How a procedure's steps run and where its progress goes. ``call``: how a row of an iteration's table is called
    (:func:`ragen_core.run.iteration.direct`, or the flows' Prefect task); ``call_step``: how a row of
    :data:`SESSION_STEPS` is called (:func:`call_step`, or the flows' Prefect task); ``step``: a line about a long
    step; ``report``: an iteration's metrics once committed; ``publish``: an iteration's metrics artifact;
    ``artifacts``: a background publisher of them (``publish`` / ``wait``)."""

    call: Call = direct
    call_step: StepCall = call_step
    step: Callable[[str], None] = _quiet
    report: Callable[[int, dict[str, float]], None] = _quiet
    publish: Callable[[str, int, dict[str, float]], Any] = _quiet
    artifacts: Callable[[], Any] = field(default=Unpublished)

    @property
    def steps(self) -> Steps:
        """The session steps by name, each called through ``call_step``."""
        return Steps(SESSION_STEPS, self.call_step)


@dataclass(frozen=True)
class Admission:
    """A request this process may now carry out: it holds the run's writer lock and, for training, knows how the
    run starts. Only :func:`admit` makes one, valid inside its ``with`` block."""

    request: Request
    run: OpenRun
    start: Start | None = None


def decide(request: RunRequest) -> Start:
    """How a training run starts: fresh, over again (it stopped in its bootstrap), resumed, extended or already done.
    Reads the lake, writes nothing."""
    manifest = request.lake.read_manifest(request.run_id)
    return resume.decide_run_start(request.lake, manifest, request.config, request.run_id, list(request.force_config))


@contextmanager
def admit(request: Request, command: list[str] | None = None) -> Iterator[Admission]:
    """Hold ``request``'s run for the ``with`` block: take its writer lock (another process holding it is refused,
    by name) and, for training, decide how the run starts while holding it."""
    with open_run(request.lake, request.run_id, command) as run:
        yield Admission(request, run, decide(request) if isinstance(request, RunRequest) else None)


Opened = tuple[RunSession | None, ResumePlan | None, dict[str, Any]]


def train(admission: Admission, hooks: Hooks) -> dict[str, Any]:
    """Train (or go on with) an admitted run, stage by stage: open, [restore], iterations, final validation, close.
    The result: the run id, the data root, ``iterations`` and what the start did (``completed``, ``bootstrap``,
    ``resumed``, ``first_iteration``). The ``train`` flow's body is these stages, in this order (flows/train.py;
    tests/flows/test_train_stages.py holds the two to one course)."""
    run = open_training(admission, hooks)
    if run.session is None:  # already done
        return run.result
    with run_status(run.session):  # closed however it ends: the manifest says how
        first = restore_training(run, hooks)
        final = training_iterations(run.session, first, hooks)
        validate_final_policy(run.session, final, hooks)
    return {**run.result, "first_iteration": first}


@dataclass(frozen=True)
class TrainingRun:
    """A training run once opened (:func:`open_training`): its request, its session (None when the run was already
    done), what a resumed or extended run restores (None for a fresh run) and the result so far."""

    request: RunRequest
    session: RunSession | None
    plan: ResumePlan | None
    result: dict[str, Any]


def open_training(admission: Admission, hooks: Hooks) -> TrainingRun:
    """The first stage of training: the session of a fresh run (after its bootstrap), of a resumed run or of an
    extended one; none when the run is already done."""
    request = admission.request
    session, plan, info = _open(admission, hooks)
    result = {
        "run_id": request.run_id,
        "data_root": str(request.lake.root),
        "iterations": request.config.trainer.iterations,
        **info,
    }
    return TrainingRun(request, session, plan, result)


def restore_training(run: TrainingRun, hooks: Hooks) -> int:
    """Inside the run's status: a sweep's point recorded, a resumed run's state restored (what it restored goes into
    ``run.result``); the first iteration to run."""
    if run.request.sweep is not None:
        run.session.record.update(sweep=run.request.sweep)
    return _restored_start(run.session, run.plan, run.result, hooks)


def training_iterations(session: RunSession, first: int, hooks: Hooks) -> int:
    """The run's iterations from ``first``, as its schedule runs them; the iteration the final validation is
    committed as."""
    return _iterations(session, first, hooks)


def validate_final_policy(session: RunSession, iteration: int, hooks: Hooks) -> dict[str, float]:
    """The last stage of training: the final policy's validation, committed as ``iteration`` and reported."""
    metrics = final_evaluation(session, iteration, hooks)
    hooks.report(iteration, metrics)
    return metrics


def _restored_start(session: RunSession, plan: ResumePlan | None, result: dict[str, Any], hooks: Hooks) -> int:
    """The first iteration to run: 0, or a resumed run's next one once its session is restored (a quarantined
    iteration recorded as skipped: only reachable with ``skip_iteration``, which ``prepare_resume`` else refuses)."""
    if plan is None:
        return 0
    if "resumed" not in result:  # an extension restored its session when it opened it
        result["resumed"] = hooks.steps.restore_session(session, plan)
    first = plan.next_iteration
    if plan.quarantined:
        hooks.steps.skip_iteration(session, first, plan.quarantined)
        first += 1
    return first


def _iterations(session: RunSession, first: int, hooks: Hooks) -> int:
    """The training iterations from ``first``, as the session's schedule runs them (synchronous, or overlapped:
    :func:`ragen_core.run.overlap.run_iterations`), each reported and its artifact published in the background once
    committed; the iteration the final validation is committed as (earlier when ``stop_early`` says so)."""
    artifacts = hooks.artifacts()

    def committed(iteration: int, metrics: dict[str, float]) -> None:
        artifacts.publish(session.run_id, iteration, metrics)
        hooks.report(iteration, metrics)

    try:
        final = run_iterations(session, first, hooks.call, committed)
    except BaseException:
        artifacts.wait(raise_error=False)
        raise
    artifacts.wait()
    return final


def final_evaluation(
    session: RunSession, iteration: int, hooks: Hooks, tell: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Validation of the final policy, committed as its own iteration (``iteration`` = number of updates:
    :data:`ragen_core.run.stages.FINAL_VALIDATION`); ``tell`` hears of each env."""
    state = IterationState(tell=tell)
    metrics = run_iteration(session, iteration, FINAL_VALIDATION, call=hooks.call, state=state)
    hooks.publish(session.run_id, iteration, metrics)
    return metrics


def _open(admission: Admission, hooks: Hooks) -> Opened:
    """The session of a fresh run (after its bootstrap) or of a resumed one (checked, its uncommitted output
    discarded: the plan says what to restore); no session when the run is already done."""
    request, start, steps = admission.request, admission.start, hooks.steps
    config, lake, run_id = request.config, request.lake, request.run_id
    manifest = lake.read_manifest(run_id)
    if start is Start.DONE:
        was = resume.record_done(lake, run_id)  # a stop after its last commit left another status
        if was is not None:
            hooks.step(done_line(run_id, was))
        return None, None, {"completed": True, "bootstrap": manifest.bootstrap}
    if start in (Start.FRESH, Start.OVER):
        session, summary = _start(request, manifest, hooks)
        return session, None, {"bootstrap": summary}
    if start is Start.EXTEND:
        return _extend(request, manifest, hooks)
    plan = steps.prepare_resume(lake, config, run_id, request.skip_iteration)
    hooks.step(resume_line(run_id, plan))
    try:
        opened = steps.open_session(config, lake, run_id, Path(manifest.model_dir), resumed=manifest)
    except BaseException as exc:  # a failed resume says so in the manifest (a refused one, above, changes nothing)
        RunRecord(lake, run_id, manifest).stopped(exc)
        raise
    return opened, plan, {"bootstrap": manifest.bootstrap}


def _extend(request: RunRequest, manifest: RunManifest, hooks: Hooks) -> Opened:
    """A completed run given more iterations: the session is opened and restored first; until then a failure puts
    the stored manifest back (the run stays completed, with its config) and the lake is untouched. Only then is the
    final validation reopened as the next training iteration; a failure before that iteration commits puts the
    run back as it was too (the session's record undoes it: :func:`ragen_core.run.resume.undo_extension`)."""
    config, lake, run_id, steps = request.config, request.lake, request.run_id, hooks.steps
    plan = steps.prepare_extension(lake, manifest, config, run_id)
    hooks.step(resume_line(run_id, plan, config.trainer.iterations))
    opened = None
    try:
        opened = steps.open_session(config, lake, run_id, Path(manifest.model_dir), resumed=manifest)
        restored = steps.restore_session(opened, plan)
    except BaseException:
        if opened is not None:
            opened.close()
        lake.write_manifest(run_id, manifest)
        raise
    try:
        steps.reopen_final_evaluation(opened, plan, manifest)
    except BaseException as exc:
        undone = opened.record.stopped(exc)
        opened.close()
        if undone is not None:
            raise undone from exc
        raise
    info = {"bootstrap": manifest.bootstrap, "resumed": {**restored, "extended_from": plan.next_iteration}}
    return opened, plan, info


def _start(
    request: RunRequest, manifest: RunManifest | None, hooks: Hooks
) -> tuple[RunSession, dict[str, Any] | None]:
    """Start a run: its manifest first (so a run killed in the bootstrap is known and resumable), then the start
    model, the bootstrap and the session. ``manifest``: the one an earlier attempt left before its session."""
    config, lake, run_id, steps = request.config, request.lake, request.run_id, hooks.steps
    early = new_manifest(config, run_id, None, None) if manifest is None else manifest.updated(status="running")
    record = RunRecord(lake, run_id, early)
    record.update()
    try:
        start_dir = steps.base_model_dir(config, lake)
        summary = steps.bootstrap_model(config, lake, start_dir, hooks.step) if config.bootstrap.enabled else None
        opened = steps.open_session(config, lake, run_id, summary[0] if summary else start_dir, resumed=manifest)
    except BaseException as exc:
        record.stopped(exc)
        raise
    # a fresh run's session wrote a full manifest: keep the run's first moment
    first = {"created_at": early.created_at, "started_at": early.started_at} if manifest is None else {}
    opened.record.update(bootstrap=summary[1] if summary else None, **first)
    return opened, summary[1] if summary else None


def evaluate(admission: Admission, hooks: Hooks) -> dict[str, Any]:
    """Evaluate an admitted request's policy on every validation env, committed as iteration 0 of its run; the same
    evaluation again returns the stored result, an interrupted one is finished (its envs done reused)."""
    request: EvalRequest = admission.request  # type: ignore[assignment]
    lake, run_id = request.lake, request.run_id
    manifest = lake.read_manifest(run_id)
    if manifest is not None and 0 in lake.committed_iterations(run_id):
        return evaluation_result(request, reused=True)
    if manifest is not None:
        lake.discard_uncommitted(run_id, 0)
    hooks.step(f"evaluation run {run_id}: loading the policy {request.which}")
    opened = hooks.steps.open_session(
        request.config, lake, run_id, request.model_dir, resumed=manifest, training=False
    )
    with run_status(opened):
        evaluated = {"target": request.target, "model": request.which, "model_dir": str(request.model_dir)}
        if request.config.model.adapter is not None:  # LoRA adapters on model_dir
            evaluated["adapter"] = request.config.model.adapter
        opened.record.update(kind="evaluation", evaluated=evaluated)
        state = IterationState(tell=hooks.step)
        for step in FINAL_VALIDATION:  # untimed: an evaluation run's metrics are its validation's
            hooks.call(step, opened, 0, state)
        metrics = state.metrics
    hooks.report(0, metrics)
    hooks.publish(run_id, 0, metrics)
    return evaluation_result(request, reused=False)


EVALUATION_COLUMNS = ("env", "instances", "k", "success_rate", "pass_at_k", "reward_mean")


def evaluation_result(request: EvalRequest, reused: bool) -> dict[str, Any]:
    """An evaluation's result: its run id, the model, the data root, whether it was stored before, and a row per
    env of the ``evaluations`` table."""
    rows = request.lake.read_table("evaluations", request.run_id).to_pylist()
    return {
        "run_id": request.run_id,
        "model": request.which,
        "data_root": str(Path(request.lake.root).resolve()),
        "reused": reused,
        "evaluations": [{k: row[k] for k in EVALUATION_COLUMNS} for row in rows],
    }


def retrain(admission: Admission, hooks: Hooks) -> dict[str, Any]:
    """session from ``init`` -> ``offline.epochs`` x (train, commit) -> validation, over the trajectories the
    request's builder selected and checked. Validation runs before the first epoch and after the last, so the run
    compares with its sources in the same tables."""
    request: RetrainRequest = admission.request  # type: ignore[assignment]
    lake, run_id, steps = request.lake, request.run_id, hooks.steps
    epochs = request.config.offline.epochs
    check_run_id_free(lake, run_id)
    init_dir, table = request.init_dir, request.selected  # resolved and checked by the request's builder
    hooks.step(f"{table.num_rows} stored trajectories selected; loading the model {request.init}")
    opened = steps.open_session(request.config, lake, run_id, init_dir)
    with run_status(opened):
        adapter = request.config.model.adapter  # LoRA adapters on init_dir: the policy started from is theirs
        init = Path(adapter) if adapter is not None else init_dir
        opened.record.update(kind="offline", lineage=steps.lineage(request.sql, table, request.mode, init, lake))
        for epoch in range(epochs):
            state = IterationState(updated=True, tell=hooks.step)  # each epoch trains: its commit saves when due
            if epoch == 0:
                hooks.step("validating the model before training")
                hooks.call(EVALUATION, opened, 0, state)
            hooks.step(f"epoch {epoch + 1} of {epochs}: {request.mode} over {table.num_rows} trajectories")
            state.metrics.update(_costed_epoch(steps, opened, table, request.mode, epoch))
            hooks.call(COMMIT, opened, epoch, state)
            hooks.report(epoch, state.metrics)
        hooks.step("validating the re-trained model")
        hooks.report(epochs, final_evaluation(opened, epochs, hooks, hooks.step))
    return {"run_id": run_id, "data_root": str(lake.root), "trajectories": table.num_rows}


def _costed_epoch(steps: Steps, opened: Any, table: Any, mode: str, epoch: int) -> dict[str, float]:
    """One offline epoch and its ``perf/*`` cost (wall time, model FLOPs, MFU, peak memory: as a StarPO update's),
    timed around the epoch's step wherever that step runs (a Prefect task or a direct call)."""
    from ragen_core.training.updater import InProcessUpdater

    if not isinstance(opened.updater, InProcessUpdater):  # the epoch refuses it, in one line
        return steps.offline_epoch(opened, table, mode, epoch)
    with opened.updater.clock() as clock:
        metrics = steps.offline_epoch(opened, table, mode, epoch)
    return {**metrics, **clock.metrics()}


__all__ = [
    "SESSION_STEPS",
    "Admission",
    "Hooks",
    "SessionStep",
    "Steps",
    "TrainingRun",
    "Unpublished",
    "admit",
    "call_step",
    "decide",
    "evaluate",
    "evaluation_result",
    "final_evaluation",
    "open_training",
    "restore_training",
    "retrain",
    "train",
    "training_iterations",
    "validate_final_policy",
]
