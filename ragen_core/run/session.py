"""A run session: what one run is while it runs.

Its config, the lake, its id, its schedule (:class:`ragen_core.run.schedule.Schedule`, chosen once when the session
opens), the policy the rollouts sample from (:class:`ragen_core.rollout.policy.RolloutPolicy`: the rollout room's),
the updater that trains that policy (:mod:`ragen_core.training.updater`: engines in this process or in a launched
group), its record (:class:`ragen_core.run.record.RunRecord`: the manifest) and its experiment trackers
(:class:`ragen_core.monitor.trackers.RunTrackers`). The policy stays in memory across stages and iterations;
stages read their inputs from the lake or their arguments, never from a global.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragen_core.agent import ChatFormatter, reply_prefix
from ragen_core.config import RunConfig
from ragen_core.envs.mcp_tools import McpHold, hold_mcp_server
from ragen_core.monitor.trackers import RunTrackers
from ragen_core.policy import ensure_tiny_model, tokenizer_fingerprint
from ragen_core.rollout.policy import RolloutPolicy, check_backend, open_rollout_policy
from ragen_core.rollout.samplers import RolloutSetup
from ragen_core.run.record import RunRecord, new_manifest, resumed_manifest
from ragen_core.run.schedule import Schedule
from ragen_core.storage import DataLake
from ragen_core.training.engines import set_determinism
from ragen_core.training.precision import resolve_precision, torch_dtype
from ragen_core.training.updater import Updater, start_updater
from schemas.manifest import RunManifest


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
        schedule: Schedule | None = None,
        mcp: McpHold | None = None,
    ) -> None:
        self.config, self.lake, self.run_id = config, lake, run_id
        self.policy, self.updater, self.record = policy, updater, record
        self.mcp = mcp  # its hold on the MCP server of env.mcp, if any: let go when it closes
        self.schedule = Schedule.of(config) if schedule is None else schedule  # chosen once, when the session opens
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
        """Stop the launched update group and the vLLM server, and let go of the MCP server (``env.mcp``: stopped
        unless another session of the process holds it), if any (idempotent; the server even when the group's stop
        fails)."""
        try:
            self.updater.close()
        finally:
            try:
                self.policy.close()
            finally:
                if self.mcp is not None:
                    self.mcp.release()


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
    """Choose the run's schedule, start the updater from ``start_model_dir`` (engines here, or the launched group),
    the rollout side, and write the run manifest (``resumed``: the stored manifest of a resumed run, kept and marked
    running again, with this attempt appended to ``resumes``). ``training=False`` (evaluation runs) skips the KL
    reference copy and the critic. The session holds the MCP server of ``env.mcp`` (started by the run's check) and
    its manifest records the server's tools (``mcp_tools``: their schemas, for the export's snippet)."""
    check_backend(config, lake.root)  # fail before loading anything when what the backend needs is missing
    schedule = Schedule.of(config)
    set_determinism(config)
    precision = resolve_precision(config.trainer.precision)
    updater = start_updater(config, lake, run_id, start_model_dir, precision, training)
    policy = mcp = None
    try:
        mcp = hold_mcp_server(config.env.mcp, config.env.user_code_timeout_s)
        policy = _rollout_policy(config, lake, run_id, updater, start_model_dir, precision, schedule)
        record = RunRecord(lake, run_id, _opening_manifest(config, run_id, start_model_dir, command, resumed, policy))
        group = updater.describe()
        where = {"precision": precision, **({"update_group": group} if group else {})}
        record.update(attempt=where, **where, **({"mcp_tools": mcp.tool_schemas()} if mcp is not None else {}))
    except BaseException:
        if mcp is not None:
            mcp.release()
        if policy is not None:
            policy.close()
        updater.close()
        raise
    return RunSession(config, lake, run_id, policy, updater, record, schedule, mcp)


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
    config: RunConfig,
    lake: DataLake,
    run_id: str,
    updater: Updater,
    model_dir: Path,
    precision: str,
    schedule: Schedule,
) -> RolloutPolicy:
    """The rollout side of a new session (the updater's model, or a copy of it), opened by the rollout room: the
    backend's sampler, and a sampler of its own beside the learner when the schedule samples there."""
    model, tokenizer = updater.rollout_policy(model_dir, torch_dtype(precision))
    setup = RolloutSetup(config, lake, run_id, model_dir, model, tokenizer, precision, schedule.staleness + 1)
    formatter = chat_formatter(config, tokenizer, prompt_context(config, model))
    return open_rollout_policy(setup, formatter, beside_learner=schedule.samples_beside_learner)


__all__ = [
    "RolloutPolicy",
    "RunSession",
    "base_model_dir",
    "chat_formatter",
    "open_session",
    "prompt_context",
]
