"""A run session: the config, the lake, and the in-memory policy that every stage of the run shares.

The policy stays in memory across stages and iterations (no weight reload per stage); stages read their inputs
from the lake or from their arguments, never from a global.
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

from ragen_core.agent import ChatFormatter
from ragen_core.config import RunConfig
from ragen_core.policy import ensure_tiny_model, load_policy, tokenizer_fingerprint
from ragen_core.storage import DataLake
from ragen_core.training import ActorEngine, CriticEngine, OptimConfig, ValueModel


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
    actor: ActorEngine
    formatter: ChatFormatter
    manifest: dict[str, Any] = field(default_factory=dict)
    critic: CriticEngine | None = None
    metric_history: list[dict[str, float]] = field(default_factory=list)  # committed iterations' metrics, in order
    position: dict[str, Any] = field(default_factory=dict)  # iteration and stage now running (for failure reports)

    @property
    def config_hash(self) -> str:
        return self.config.config_hash()

    def update_manifest(self, **changes: Any) -> None:
        self.manifest.update(changes, updated_at=utc_now())
        self.lake.write_manifest(self.run_id, self.manifest)


def new_manifest(config: RunConfig, run_id: str, model_dir: Path, command: list[str] | None) -> dict[str, Any]:
    """The run manifest: config, hash, seed, versions, git commit, host, command, status and timestamps."""
    now = utc_now()
    return {
        "run_id": run_id,
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "seed": config.seed,
        "model_dir": str(model_dir),
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
) -> RunSession:
    """Load the policy from ``start_model_dir``, start its DeepSpeed engine(s) and write the run manifest (a resumed
    run keeps its manifest, marked running again, with this attempt appended to ``resumes``)."""
    set_determinism(config)
    model, tokenizer = load_policy(start_model_dir)
    optim = OptimConfig(
        lr=config.actor.lr,
        weight_decay=config.actor.weight_decay,
        grad_clip=config.actor.grad_clip,
        micro_batch_size=config.actor.micro_batch_size,
        zero_stage=config.actor.zero_stage,
    )
    actor = ActorEngine(model, optim, keep_reference=config.algorithm.kl_coef > 0)
    critic = build_critic(config, start_model_dir) if config.algorithm.needs_critic else None
    session = RunSession(config, lake, run_id, start_model_dir, tokenizer, actor, ChatFormatter(tokenizer))
    session.critic = critic
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
        for stale in ("error", "failed_iteration", "failed_stage"):
            session.manifest.pop(stale, None)
    session.update_manifest()
    return session


def build_critic(config: RunConfig, start_model_dir: Path) -> CriticEngine:
    """The critic's engine: a scalar head on the transformer of ``critic.path`` (default: the policy's start model)."""
    critic = config.critic
    backbone_dir = Path(critic.path).expanduser().resolve() if critic.path else start_model_dir
    optim = OptimConfig(
        lr=critic.lr,
        weight_decay=critic.weight_decay,
        grad_clip=critic.grad_clip,
        micro_batch_size=critic.micro_batch_size or config.actor.micro_batch_size,
        zero_stage=config.actor.zero_stage,
    )
    return CriticEngine(ValueModel.from_pretrained(backbone_dir, head_seed=config.seed), optim)


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
