"""A run session: the config, the lake, and the in-memory policy that every stage of the run shares.

The policy stays in memory across stages and iterations (no weight reload per stage); stages read their inputs
from the lake or from their arguments, never from a global. With ``trainer.launcher`` set to ``torchrun`` or
``deepspeed`` the engines live in a launched group of processes (:mod:`ragen_core.training.group`) and this process
keeps only the rollout side: a copy of the policy that loads the group's export after every update.
"""

from __future__ import annotations

import getpass
import os
import platform
import socket
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from ragen_core.agent import ChatFormatter, reply_prefix
from ragen_core.config import RunConfig
from ragen_core.policy import ensure_tiny_model, load_policy, tokenizer_fingerprint
from ragen_core.storage import DataLake
from ragen_core.training import ActorEngine, CriticEngine
from ragen_core.training.engines import build_critic_engine, start_engines
from ragen_core.training.precision import resolve_precision, torch_dtype


class RunExistsError(RuntimeError):
    """The run id is already taken in this data root."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def library_versions() -> dict[str, str]:
    """Versions of the libraries that decide a run's numbers."""
    versions = {"python": sys.version.split()[0]}
    for package in ("torch", "transformers", "deepspeed", "prefect", "pyarrow", "duckdb", "ragen-flows"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def set_determinism(config: RunConfig) -> None:
    """Fixed thread count and deterministic kernels where torch has them."""
    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also NaN-fills every torch.empty; DeepSpeed's ZeRO-1/2/3 allocate large buffers at
    # every step, which that turns into seconds of memset per step (measured: 8.5 s vs 0.1 s). Kernels stay
    # deterministic without it.
    torch.utils.deterministic.fill_uninitialized_memory = False


def base_model_dir(config: RunConfig, lake: DataLake) -> Path:
    """The model the run starts from: ``model.path`` or the tiny default (built under the data root if absent)."""
    if config.model.path:
        return Path(config.model.path).expanduser().resolve()
    return ensure_tiny_model(config.model.tiny, lake.models_dir())


@dataclass
class RunSession:
    """Everything one run's stages share in memory."""

    config: RunConfig
    lake: DataLake
    run_id: str
    model_dir: Path
    tokenizer: Any
    actor: ActorEngine | None  # None when a launched update group holds the engines
    formatter: ChatFormatter
    manifest: dict[str, Any] = field(default_factory=dict)
    critic: CriticEngine | None = None
    metric_history: list[dict[str, float]] = field(default_factory=list)  # committed iterations' metrics, in order
    position: dict[str, Any] = field(default_factory=dict)  # iteration and stage now running (for failure reports)
    precision: str = "fp32"  # the resolved trainer.precision
    update_group: Any = None  # ragen_core.training.group.UpdateGroup when trainer.launcher launches one
    rollout_model: torch.nn.Module | None = None  # the rollout side's policy copy when the engines live in a group
    rollout_engine: Any = None  # ragen_core.rollout.vllm_backend.VLLMEngine when rollout.backend is vllm

    @property
    def config_hash(self) -> str:
        return self.config.config_hash()

    @property
    def policy_model(self) -> torch.nn.Module:
        """The policy the Hugging Face backend samples from: the actor's own module in one process, else the copy."""
        if self.rollout_model is not None:
            return self.rollout_model
        if self.actor is None:
            raise RuntimeError("this session has neither an actor engine nor a rollout copy of the policy")
        return self.actor.module

    def close(self) -> None:
        """Stop the launched update group and the vLLM engine, if any (idempotent)."""
        if self.update_group is not None:
            self.update_group.stop()
        if self.rollout_engine is not None:
            self.rollout_engine.close()
            self.rollout_engine = None

    def update_manifest(self, **changes: Any) -> None:
        self.manifest.update(changes, updated_at=utc_now())
        self.lake.write_manifest(self.run_id, self.manifest)


def new_manifest(config: RunConfig, run_id: str, model_dir: Path | None, command: list[str] | None) -> dict[str, Any]:
    """The run manifest: config, hash, seed, versions, git commit, host, command, status and timestamps.

    ``model_dir`` is None in the manifest a run writes at its first moment, before the bootstrap and the session:
    a run killed there is then known (``ragen resume`` starts it over), and the session fills the folder in."""
    now = utc_now()
    return {
        "run_id": run_id,
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "seed": config.seed,
        "model_dir": str(model_dir) if model_dir is not None else None,
        "versions": library_versions(),
        "git_commit": git_commit(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "user": getpass.getuser(),
        "pid": os.getpid(),
        "command": command or sys.argv,
        "status": "running",
        "created_at": now,
        "started_at": now,
        "updated_at": now,
    }


STOP_FIELDS = ("failed_iteration", "failed_stage", "interrupted_iteration", "interrupted_stage",
               "last_committed_iteration")  # fmt: skip


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C or was raised while handling one (a library's clean-up that fails on the way out,
    e.g. Prefect's "Task run is not set" when the Ctrl-C lands while it creates a task run)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def stop_record(exc: BaseException, where: dict[str, Any] | None, committed: list[int]) -> dict[str, Any]:
    """The manifest fields of a run stopped by ``exc``: status ``interrupted`` for a Ctrl-C (KeyboardInterrupt),
    else ``failed`` with the error; the iteration and stage it stopped in (``where``, a session's position) and its
    last committed iteration (``ragen resume`` continues after it)."""
    where = where or {}
    last = committed[-1] if committed else None
    if interrupted(exc):
        return {"status": "interrupted", "interrupted_iteration": where.get("iteration"),
                "interrupted_stage": where.get("stage"), "last_committed_iteration": last}  # fmt: skip
    return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "failed_iteration": where.get("iteration"),
            "failed_stage": where.get("stage"), "last_committed_iteration": last}  # fmt: skip


def default_run_id(config: RunConfig) -> str:
    """``<env>-<config hash[:8]>-<UTC timestamp>``."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{config.env.name}-{config.config_hash()[:8]}-{stamp}"


def check_run_id_free(lake: DataLake, run_id: str) -> None:
    """Refuse a run id that already has a manifest in this data root."""
    manifest = lake.read_manifest(run_id)
    if manifest is not None:
        raise RunExistsError(
            f"run {run_id!r} already exists in {lake.root} (status: {manifest.get('status')}); "
            "choose a new --run-id or remove that run"
        )


def open_session(
    config: RunConfig,
    lake: DataLake,
    run_id: str,
    start_model_dir: Path,
    command: list[str] | None = None,
    resumed_manifest: dict[str, Any] | None = None,
    training: bool = True,
) -> RunSession:
    """Load the policy from ``start_model_dir``, start its DeepSpeed engine(s) and write the run manifest (a resumed
    run keeps its manifest, marked running again, with this attempt appended to ``resumes``). ``training=False``
    (evaluation runs) skips the KL reference copy and the critic."""
    if config.rollout.backend == "vllm":  # fail before loading anything when the gpu extra is missing
        from ragen_core.rollout.vllm_backend import import_vllm

        import_vllm()
    set_determinism(config)
    precision = resolve_precision(config.trainer.precision)
    launched = training and config.trainer.launcher != "inprocess"
    if launched:  # the engines live in the launched group; this process keeps a rollout copy of the policy
        model, tokenizer = load_policy(start_model_dir, dtype=torch_dtype(precision))
        model.to(rollout_device()).eval()
        actor, critic = None, None
    else:
        actor, critic, tokenizer = start_engines(config, start_model_dir, precision, training)
    prefix = reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)
    formatter = ChatFormatter(tokenizer, reply_prefix=prefix)
    session = RunSession(config, lake, run_id, start_model_dir, tokenizer, actor, formatter)
    session.critic, session.precision = critic, precision
    if launched:
        session.rollout_model = model
    if resumed_manifest is None:
        session.manifest = new_manifest(config, run_id, start_model_dir, command)
        session.manifest["tokenizer_fingerprint"] = tokenizer_fingerprint(tokenizer)
    else:
        attempt = {"at": utc_now(), "host": socket.gethostname(), "pid": os.getpid(), "command": command or sys.argv}
        session.manifest = {
            **resumed_manifest,
            "status": "running",
            "config": config.to_dict(),
            "config_hash": config.config_hash(),
            "versions": library_versions(),
            "resumes": [*resumed_manifest.get("resumes", []), attempt],
        }
        if not resumed_manifest.get("model_dir"):  # the run stopped before its first session (e.g. in the bootstrap)
            session.manifest["model_dir"] = str(start_model_dir)
            session.manifest["tokenizer_fingerprint"] = tokenizer_fingerprint(tokenizer)
        for stale in ("error", "update_group", *STOP_FIELDS):
            session.manifest.pop(stale, None)
    session.manifest["precision"] = precision
    try:
        start_group_and_rollout_engine(session, launched)
    except BaseException:
        session.close()
        raise
    session.update_manifest()
    return session


def rollout_device() -> torch.device:
    """Where this process's rollout copy of the policy runs: the first visible GPU, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def start_group_and_rollout_engine(session: RunSession, launched: bool) -> None:
    """Start what the session needs besides its engines: the launched update group (recorded in the manifest, and in
    this attempt's entry of a resumed run) and the vLLM engine when ``rollout.backend`` is vllm."""
    config = session.config
    if launched:
        from ragen_core.training.group import UpdateGroup

        trainer = config.trainer
        init = {
            "config": config.to_dict(),
            "data_root": str(session.lake.root),
            "run_id": session.run_id,
            "model_dir": str(session.model_dir),
            "precision": session.precision,
        }
        session.update_group = UpdateGroup.start(
            trainer.launcher, trainer.nproc, trainer.hostfile, session.lake.run_dir(session.run_id), init
        )
        described = {"launcher": trainer.launcher, "nproc": trainer.nproc, **session.update_group.describe()}
        session.manifest["update_group"] = described
        if session.manifest.get("resumes"):
            session.manifest["resumes"][-1]["update_group"] = described
    if session.manifest.get("resumes"):
        session.manifest["resumes"][-1]["precision"] = session.precision
    if config.rollout.backend == "vllm":
        from ragen_core.rollout.vllm_backend import VLLMEngine

        session.rollout_engine = VLLMEngine.from_config(config, session.model_dir, session.precision)


def sync_rollout_weights(session: RunSession, exported: Path | None = None) -> None:
    """After an update (or a restore): bring the rollout side to the new weights.

    ``exported``: the launched group's Hugging Face export, copied into the rollout copy of the policy. A vLLM
    engine reloads the weights in place from an export (in one process the actor's module is exported first). In one
    process with the Hugging Face backend there is nothing to do: the rollouts sample from the actor's own module.
    """
    from ragen_core.training.checkpoint import export_policy, load_exported_weights
    from ragen_core.training.group import group_dir

    if exported is not None and session.rollout_model is not None:
        load_exported_weights(session.rollout_model, exported)
    if session.rollout_engine is not None:
        if exported is None:
            folder = group_dir(session.lake.run_dir(session.run_id)) / "policy"
            exported = export_policy(session.actor, session.tokenizer, folder)
        session.rollout_engine.load_weights(exported)


def build_critic(config: RunConfig, start_model_dir: Path, precision: str = "fp32") -> CriticEngine:
    """The critic's engine: a scalar head on the transformer of ``critic.path`` (default: the policy's start model)."""
    return build_critic_engine(config, start_model_dir, precision)


def git_commit() -> str | None:
    """The commit of the running code (``+dirty`` when tracked files differ from it); None outside a git checkout
    or without git."""
    import subprocess

    source = Path(__file__).resolve().parent.parent
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
