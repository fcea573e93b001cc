"""A run's record: its manifest (config, versions, host, status, where it stopped) and the status it moves through.

running -> completed, or -> failed / interrupted (Ctrl-C) with the iteration and stage it stopped in and its last
committed iteration. :func:`run_status` is that life around a run's body, used the same way by training,
evaluation and offline re-training: whatever ends the body, the manifest says so and the session is closed.
"""

from __future__ import annotations

import functools
import getpass
import os
import platform
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragen_core.config import RunConfig
from ragen_core.monitor.trackers.base import RunEnd
from ragen_core.storage import DataLake
from ragen_core.storage.lease import LeaseLostError
from ragen_core.storage.locks import lost_writing
from ragen_core.storage.maintenance.space import (
    SPACE_PREFIX,
    hold_reserve,
    release_reserve,
    reserve_file,
    space_failure,
    space_message,
    written_what,
)
from ragen_core.storage.names import without_split_words
from schemas.manifest import RunManifest

if TYPE_CHECKING:
    from ragen_core.envs.external import CodeSource
    from ragen_core.run.session import RunSession


class RunExistsError(RuntimeError):
    """The run id is already taken in this data root."""


STOP_FIELDS = (
    "failed_iteration",
    "failed_stage",
    "interrupted_iteration",
    "interrupted_stage",
    "last_committed_iteration",
)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunRecord:
    """The run's manifest as this process keeps it, plus what the collapse monitor and a failure report need."""

    lake: DataLake
    run_id: str
    manifest: RunManifest
    metric_history: list[dict[str, float]] = field(default_factory=list)  # committed iterations' metrics, in order
    position: dict[str, Any] = field(default_factory=dict)  # iteration and stage now running (for failure reports)
    # an extension's undo (ragen_core.run.resume.undo_extension): given the failure's line, it puts the completed run
    # back as it was and returns the error to raise instead, or returns None when it can no longer (see stopped())
    undo: Callable[[str], BaseException | None] | None = None

    def update(self, attempt: dict[str, Any] | None = None, **changes: Any) -> None:
        """Change manifest fields (and, with ``attempt``, this attempt's entry of ``resumes`` when the run was
        resumed), then write the manifest (atomically)."""
        manifest = self.manifest.with_attempt(**attempt) if attempt else self.manifest
        self.manifest = manifest.updated(**changes, updated_at=utc_now())
        self.lake.write_manifest(self.run_id, self.manifest)

    def hold_reserve(self) -> None:
        """Hold back a little disk space while the run runs
        (:func:`ragen_core.storage.maintenance.space.hold_reserve`): when a write finds the disk full, :meth:`stopped`
        gives it back to record the failure."""
        hold_reserve(reserve_file(self.lake, self.run_id))

    def stopped(self, exc: BaseException) -> BaseException | None:
        """Record that ``exc`` stopped the run (see :func:`stop_record`); a write that found no space is recorded
        as that, in the line the command prints. With the disk full, the space the run held back
        (:meth:`hold_reserve`) is given back so the manifest can still be written; should even that fail, the error
        goes on unrecorded (the manifest keeps its last state) rather than be replaced by that one.

        A failed extension whose :attr:`undo` puts the completed run back records nothing: the error to raise
        instead (its line says so) is returned. Else None."""
        if isinstance(exc, LeaseLostError):  # another machine writes the run now: this process records nothing
            return None
        record = stop_record(exc, self.position, self.lake.committed_iterations(self.run_id))
        space = record["status"] == "failed" and space_failure(self.lake.root, self.run_id, exc) is not None
        if space:
            release_reserve(reserve_file(self.lake, self.run_id))  # room for the manifest's new copy
        if record["status"] == "failed" and self.undo is not None:
            undone = self.undo(space_message(None, written_what(exc, self.position)) if space else record["error"])
            if undone is not None:
                return undone
        if space:
            record["error"] = space_message(self.run_id, written_what(exc, self.position))
        try:
            self.update(**record)
        except OSError:
            if record.get("error", "").startswith(SPACE_PREFIX):
                return None
            raise
        return None


@contextmanager
def run_status(session: RunSession) -> Iterator[RunSession]:
    """The body of a run: ``completed`` as soon as it returns (everything is committed: a stop that lands while the
    session closes, such as joining an async run's sampler process, changes none of it), ``failed`` /
    ``interrupted`` (where, and the last committed iteration) when it raises, or put back as it was (a failed
    extension: :meth:`RunRecord.stopped`, whose error is raised instead). The session's updater and rollout engine are
    closed either way, then its trackers end their runs with that status (and the run's plot)."""
    session.record.hold_reserve()
    status: RunEnd = "completed"
    try:
        yield session
    except BaseException as exc:
        status = "interrupted" if interrupted(exc) else "failed"  # what stopped() records, even if it cannot
        undone = session.record.stopped(exc)
        if undone is not None:
            status = "completed"
            raise undone from exc
        raise
    else:
        session.record.update(status="completed")
    finally:
        try:
            try:
                session.close()
            finally:
                session.trackers.finish(status)
        finally:
            if not lost_writing(session.lake.root, session.run_id):  # else the reserve is the new writer's
                release_reserve(reserve_file(session.lake, session.run_id))  # held only while the run runs


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a stop from outside or was raised while handling one (a library's clean-up that fails on
    the way out, e.g. Prefect's "Task run is not set" when the Ctrl-C lands while it creates a task run). A stop is a
    Ctrl-C (KeyboardInterrupt) or a SIGTERM turned into an exception by the orchestration layer (Prefect raises a
    ``BaseException`` that carries the ``signal``; the core knows it by that, not by importing Prefect)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        signalled = getattr(current, "signal", None) in STOP_SIGNALS
        if signalled and not isinstance(current, Exception | SystemExit | GeneratorExit):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def stop_record(exc: BaseException, where: dict[str, Any] | None, committed: list[int]) -> dict[str, Any]:
    """The manifest fields of a run stopped by ``exc``: status ``interrupted`` for a Ctrl-C (KeyboardInterrupt),
    else ``failed`` with the error; the iteration and stage it stopped in (``where``, a record's position) and its
    last committed iteration (``ragen resume`` continues after it)."""
    where = where or {}
    last = committed[-1] if committed else None
    if interrupted(exc):
        return {
            "status": "interrupted",
            "interrupted_iteration": where.get("iteration"),
            "interrupted_stage": where.get("stage"),
            "last_committed_iteration": last,
        }
    return {
        "status": "failed",
        "error": f"{type(exc).__name__}: {exc}",
        "failed_iteration": where.get("iteration"),
        "failed_stage": where.get("stage"),
        "last_committed_iteration": last,
    }


def library_versions() -> dict[str, str]:
    """Versions of the libraries that decide a run's numbers."""
    versions = {"python": sys.version.split()[0]}
    for package in ("torch", "transformers", "deepspeed", "prefect", "pyarrow", "duckdb", "ragen-flows"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def code_sources(config: RunConfig) -> dict[str, dict[str, str | None]]:
    """Where the code a run plays comes from, by what the config names it: every env (``env.name``,
    ``env.val_envs``) and the env's ``reward_fn`` and ``wrong_answer_fn``, each with its import path and the
    distribution (name, version) that installed it (None: a module on the import path, installed by none); an env
    played on a server (``env.remote``) as the server says, with its URL. The config names only code already checked
    to import (``run.checks``). Each answer is kept for the life of the process (:func:`_env_source`)."""
    from ragen_core.envs import env_factory
    from ragen_core.envs.remote import served_env

    sources = {}
    for name in dict.fromkeys([config.env.name, *(config.env.val_envs or [])]):
        remote = config.env.remote_for(name)
        if remote is not None:  # the server's code, as it says (GET /ragen/env), and the server
            sources[name] = {**served_env(remote, config.env.user_code_timeout_s).source, "remote": remote}
            continue
        sources[name] = _env_source(name, env_factory(name)).to_dict()
    for key in ("reward_fn", "wrong_answer_fn"):  # the dataset env's functions
        function = config.env.options.get(key)
        if isinstance(function, str):
            sources[function] = _function_source(function, key).to_dict()
    return sources


@functools.cache
def _env_source(name: str, factory: Any) -> CodeSource:
    """:func:`ragen_core.envs.external.env_source`, once per env and factory in a process. Finding the distribution
    that installed a module reads every installed distribution's file list (about a quarter of a tiny run's own
    time, twice per run); the answer cannot change while the process has the module imported."""
    from ragen_core.envs.external import env_source

    return env_source(name, factory)


@functools.cache
def _function_source(path: str, key: str) -> CodeSource:
    """:func:`ragen_core.envs.external.code_source` of the function at ``path`` (the env option ``key``), once per
    process (:func:`_env_source`)."""
    from ragen_core.envs.external import code_source, import_object

    return code_source(import_object(path, f"env.options.{key}"))


def recorded_code(manifest: RunManifest) -> str:
    """What a manifest's ``code_sources`` say of the code from outside this project, in a few words (for the line
    that says a resumed run's module is missing); empty when it records none."""
    found = []
    for source in (manifest.code_sources or {}).values():
        if not isinstance(source, dict) or str(source.get("import_path", "")).startswith("ragen_core."):
            continue
        dist = source.get("distribution")
        where = f"distribution {dist} {source.get('version') or ''}".strip() if dist else "no distribution"
        found.append(f"{source.get('import_path')} from {where}")
    return f"the run recorded {'; '.join(found)}" if found else ""


def new_manifest(config: RunConfig, run_id: str, model_dir: Path | None, command: list[str] | None) -> RunManifest:
    """The run manifest: config, hash, seed, versions, where its env code comes from (:func:`code_sources`), git
    commit, host, command, status and timestamps.

    ``model_dir`` is None in the manifest a run writes at its first moment, before the bootstrap and the session:
    a run killed there is then known (``ragen resume`` starts it over), and the session fills the folder in."""
    now = utc_now()
    return RunManifest(
        run_id=run_id,
        config=config.to_dict(),
        config_hash=config.config_hash(),
        seed=config.seed,
        model_dir=str(model_dir) if model_dir is not None else None,
        versions=library_versions(),
        code_sources=code_sources(config),
        git_commit=git_commit(),
        host=socket.gethostname(),
        platform=platform.platform(),
        user=getpass.getuser(),
        pid=os.getpid(),
        command=command or sys.argv,
        status="running",
        created_at=now,
        started_at=now,
        updated_at=now,
    )


def resumed_manifest(manifest: RunManifest, config: RunConfig, command: list[str] | None) -> RunManifest:
    """A resumed run's manifest: the stored one marked running again, with the (allowed) config, this attempt
    appended to ``resumes`` and the fields of the last stop removed."""
    attempt = {"at": utc_now(), "host": socket.gethostname(), "pid": os.getpid(), "command": command or sys.argv}
    return manifest.without("error", "update_group", *STOP_FIELDS).updated(
        status="running",
        config=config.to_dict(),
        config_hash=config.config_hash(),
        versions=library_versions(),
        code_sources=code_sources(config),
        resumes=[*manifest.resumes, attempt],
    )


def default_run_id(config: RunConfig) -> str:
    """``<env>-<config hash[:8]>-<UTC timestamp>``; an env named ``package.module:Class`` is said by its class name,
    characters a run id does not take become ``-``, and split words of Hugging Face ``datasets`` are written short
    (``bandit_test`` -> ``bandit_tst``: :func:`~ragen_core.storage.names.without_split_words`)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    name = config.env.name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    slug = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in name).lstrip(".-")[:64]
    return f"{without_split_words(slug or 'env')}-{config.config_hash()[:8]}-{stamp}"


def check_run_id_free(lake: DataLake, run_id: str) -> None:
    """Refuse a run id that already has a manifest in this data root."""
    manifest = lake.read_manifest(run_id)
    if manifest is not None:
        raise RunExistsError(
            f"run {run_id!r} already exists in {lake.root} (status: {manifest.status}); "
            "choose a new --run-id or remove that run"
        )


def git_commit() -> str | None:
    """The commit of the running code (``+dirty`` when tracked files differ from it); None outside a git checkout
    or without git."""
    source = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("+dirty" if dirty else "")
