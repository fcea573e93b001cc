"""A run session: what one run is while it runs.

Its config, the lake, its id, the policy the rollouts sample from (:class:`RolloutPolicy`), the updater that trains
that policy (:mod:`ragen_core.training.updater`: engines in this process or in a launched group), its record
(:class:`ragen_core.run.record.RunRecord`: the manifest) and its experiment trackers
(:class:`ragen_core.monitor.trackers.RunTrackers`). The policy stays in memory across stages and iterations;
stages read their inputs from the lake or their arguments, never from a global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ragen_core.agent import ChatFormatter, reply_prefix
from ragen_core.config import RolloutConfig, RunConfig
from ragen_core.monitor.trackers import RunTrackers
from ragen_core.policy import ensure_tiny_model, tokenizer_fingerprint
from ragen_core.rollout import ScriptedBackend
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.run.record import RunRecord, new_manifest, resumed_manifest
from ragen_core.run.sampler import SamplerProcess
from ragen_core.storage import DataLake
from ragen_core.training.engines import set_determinism
from ragen_core.training.precision import resolve_precision, torch_dtype
from ragen_core.training.updater import Updater, start_updater
from schemas.manifest import RunManifest


@dataclass
class RolloutPolicy:
    """The rollout side: the policy the Hugging Face backend samples from, its tokenizer and chat format, and a vLLM
    rollout server when ``rollout.backend`` is vllm. The updater keeps it at the current weights (``Updater.sync``)."""

    model_dir: Path  # the model the run started from
    tokenizer: Any
    formatter: ChatFormatter
    model: torch.nn.Module
    engine: Any = None  # ragen_core.rollout.vllm_backend.VLLMServer
    scripted_options: dict[str, Any] = field(default_factory=dict)  # rollout.backend=scripted: the policy's options
    sampler: SamplerProcess | None = None  # an async run's training rollouts (backend=hf): ragen_core.run.sampler

    def backend(self, rollout: RolloutConfig, temperature: float) -> Any:
        """The generation backend ``rollout.backend`` names, sampling at ``temperature``."""
        if rollout.backend == "scripted":
            return ScriptedBackend(rollout.scripted_policy, self.tokenizer, self.scripted_options)
        if rollout.backend == "vllm":
            from ragen_core.rollout.vllm_backend import VLLMBackend

            return VLLMBackend(
                self.engine, self.tokenizer, temperature, rollout.max_new_tokens, rollout.top_p, rollout.top_k
            )
        return HFBackend(
            self.model, self.tokenizer, temperature, rollout.max_new_tokens, top_p=rollout.top_p, top_k=rollout.top_k
        )

    def training_backend(self, rollout: RolloutConfig) -> Any:
        """The backend of the training rollouts: the sampler process's when the run has one (an async run), else
        :meth:`backend` at ``rollout.temperature``."""
        if self.sampler is not None:
            return self.sampler.backend(rollout.temperature, rollout.max_new_tokens, rollout.top_p, rollout.top_k)
        return self.backend(rollout, rollout.temperature)

    def close(self) -> None:
        try:
            if self.sampler is not None:
                self.sampler.close()
                self.sampler = None
        finally:
            if self.engine is not None:
                self.engine.close()
                self.engine = None


class RunSession:
    """Everything one run's stages share in memory."""

    def __init__(
        self,
        config: RunConfig,
        lake: DataLake,
        run_id: str,
        policy: RolloutPolicy,
        updater: Updater,
        record: RunRecord,
    ) -> None:
        self.config, self.lake, self.run_id = config, lake, run_id
        self.policy, self.updater, self.record = policy, updater, record
        self.last_commit: float | None = None  # perf_counter() at this process's last commit (time/step)
        # started at the first commit, when a sweep's point is recorded in the manifest
        self.trackers = RunTrackers(config, lake, run_id, lambda: (record.manifest.sweep or {}).get("id"))

    def __repr__(self) -> str:
        return f"RunSession({self.run_id!r})"

    @property
    def config_hash(self) -> str:
        return self.config.config_hash()

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    def close(self) -> None:
        """Stop the launched update group and the vLLM server, if any (idempotent; the server even when the group's
        stop fails)."""
        try:
            self.updater.close()
        finally:
            self.policy.close()


def base_model_dir(config: RunConfig, lake: DataLake) -> Path:
    """The model the run starts from: ``model.path`` or the tiny default (built under the data root if absent)."""
    if config.model.path:
        return Path(config.model.path).expanduser().resolve()
    return ensure_tiny_model(config.model.tiny, lake.models_dir())


def open_session(
    config: RunConfig,
    lake: DataLake,
    run_id: str,
    start_model_dir: Path,
    command: list[str] | None = None,
    resumed: RunManifest | None = None,
    training: bool = True,
) -> RunSession:
    """Start the updater from ``start_model_dir`` (engines here, or the launched group), the rollout side, and write
    the run manifest (``resumed``: the stored manifest of a resumed run, kept and marked running again, with this
    attempt appended to ``resumes``). ``training=False`` (evaluation runs) skips the KL reference copy and the
    critic."""
    if config.rollout.backend == "vllm":  # fail before loading anything when the vLLM environment is missing
        from ragen_core.rollout.vllm_backend import vllm_python

        vllm_python(config.rollout.vllm.python, lake.root)
    set_determinism(config)
    precision = resolve_precision(config.trainer.precision)
    updater = start_updater(config, lake, run_id, start_model_dir, precision, training)
    policy = None
    try:
        policy = _rollout_policy(config, lake, run_id, updater, start_model_dir, precision)
        record = RunRecord(lake, run_id, _opening_manifest(config, run_id, start_model_dir, command, resumed, policy))
        group = updater.describe()
        where = {"precision": precision, **({"update_group": group} if group else {})}
        record.update(attempt=where, **where)
    except BaseException:
        if policy is not None:
            policy.close()
        updater.close()
        raise
    return RunSession(config, lake, run_id, policy, updater, record)


def _opening_manifest(
    config: RunConfig,
    run_id: str,
    start_model_dir: Path,
    command: list[str] | None,
    resumed: RunManifest | None,
    policy: RolloutPolicy,
) -> RunManifest:
    """A fresh run's manifest, or a resumed run's stored one marked running again."""
    fingerprint = tokenizer_fingerprint(policy.tokenizer)
    if resumed is None:
        return new_manifest(config, run_id, start_model_dir, command).updated(tokenizer_fingerprint=fingerprint)
    manifest = resumed_manifest(resumed, config, command)
    if not resumed.model_dir:  # the run stopped before its first session (e.g. in the bootstrap)
        return manifest.updated(model_dir=str(start_model_dir), tokenizer_fingerprint=fingerprint)
    return manifest


def scripted_options(config: RunConfig) -> dict[str, Any]:
    """The options the config gives scripted policies (``teacher_mix``'s ``teacher_prob``)."""
    return {"teacher_prob": config.bootstrap.teacher_prob}


def chat_formatter(config: RunConfig, tokenizer: Any, context_tokens: int | None = None) -> ChatFormatter:
    """The prompts of the config's rollouts: its prompt style and reply prefix over the tokenizer's chat template; a
    prompt longer than ``context_tokens`` (:func:`prompt_context`) is refused by the rollouts."""
    prefix = reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)
    return ChatFormatter(
        tokenizer, reply_prefix=prefix, style=config.rollout.prompt_style, context_tokens=context_tokens
    )


def prompt_context(config: RunConfig, model: Any) -> int | None:
    """The most tokens a prompt may hold: the model's context (its config's ``max_position_embeddings``), or the
    vLLM server's ``rollout.vllm.max_model_len`` when that is set and smaller; None when neither is known."""
    limits = [getattr(getattr(model, "config", None), "max_position_embeddings", None)]
    if config.rollout.backend == "vllm":
        limits.append(config.rollout.vllm.max_model_len)
    known = [limit for limit in limits if isinstance(limit, int) and limit > 0]
    return min(known) if known else None


def _rollout_policy(
    config: RunConfig, lake: DataLake, run_id: str, updater: Updater, model_dir: Path, precision: str
) -> RolloutPolicy:
    """The rollout side of a new session (the updater's model, or a copy of it; a vLLM engine when configured)."""
    model, tokenizer = updater.rollout_policy(model_dir, torch_dtype(precision))
    policy = RolloutPolicy(
        model_dir, tokenizer, chat_formatter(config, tokenizer, prompt_context(config, model)), model
    )
    policy.scripted_options = scripted_options(config)
    try:
        if config.trainer.max_staleness and config.rollout.backend == "hf":
            folder = lake.sampler_dir(run_id)
            folder.mkdir(parents=True, exist_ok=True)
            threads = config.rollout.sampler_threads
            policy.sampler = SamplerProcess.start(model_dir, model, threads, folder / "sampler.log")
        if config.rollout.backend == "vllm":
            policy.engine = start_vllm_server(config, lake.vllm_server_dir(run_id), model_dir, precision, lake.root)
            policy.engine.check_weights(model)  # the server computes what the trainer's model computes
    except BaseException:
        policy.close()
        raise
    return policy


def start_vllm_server(
    config: RunConfig, folder: Path, model_dir: Path, precision: str, data_root: Path | None = None
) -> Any:
    """The run's vLLM rollout server on ``model_dir`` (``rollout.vllm``; its log in ``folder``; no vLLM environment
    found inside ``data_root`` is taken for the default one)."""
    from ragen_core.rollout.vllm_backend import VLLMServer, vllm_python

    settings = config.rollout.vllm
    return VLLMServer.start(
        vllm_python(settings.python, data_root),
        model_dir,
        folder,
        dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision],
        seed=config.seed,
        enforce_eager=settings.enforce_eager,
        prefix_caching=settings.prefix_caching,
        max_model_len=settings.max_model_len,
        kv_cache_gib=settings.kv_cache_gib,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        tensor_parallel_size=settings.tensor_parallel_size,
        startup_timeout=settings.startup_timeout,
        check_tolerance=settings.check_tolerance,
    )
