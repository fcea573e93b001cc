"""The whole run's config: :class:`RunConfig`, its sections, and the checks across sections that need no registry."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field, model_validator

from ragen_core.config.algorithm import AlgorithmConfig
from ragen_core.config.base import Section, Seed
from ragen_core.config.generation import EnvConfig, ModelConfig, RolloutConfig
from ragen_core.config.monitoring import EvalConfig, MonitorConfig
from ragen_core.config.optimisation import ActorConfig, BootstrapConfig, CriticConfig, OfflineConfig, TrainerConfig


class RunConfig(Section):
    """The whole run."""

    seed: Seed = Field(0, description="Run seed (0 to 2**32 - 1); everything random derives from it.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    offline: OfflineConfig = Field(default_factory=OfflineConfig)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> RunConfig:
        # names checked against the registries (and the critic's batches, as the estimator needs one) are checked
        # by the loader once this tree is valid: ragen_core.run.checks
        if self.actor.mini_batch_size % self.actor.micro_batch_size:
            raise ValueError(
                f"actor.mini_batch_size={self.actor.mini_batch_size} must be a multiple of "
                f"actor.micro_batch_size={self.actor.micro_batch_size}"
            )
        _check_scale_out(self)
        algorithm = self.algorithm
        entropy_metric = algorithm.filter_metric in ("entropy", "entropy_variance")
        sampled_entropy = entropy_metric and algorithm.filter_entropy == "sampled"
        if sampled_entropy and self.rollout.backend == "scripted":
            raise ValueError(
                f"algorithm.filter_metric={algorithm.filter_metric} with filter_entropy=sampled needs behaviour "
                "log-probs, which scripted rollouts (rollout.backend=scripted) do not have: set "
                "algorithm.filter_entropy=full (the policy scores the rows) or choose a reward or length metric"
            )
        if self.actor.reuse_behavior_logprobs == "always" and self.rollout.backend == "scripted":
            raise ValueError(
                "actor.reuse_behavior_logprobs=always needs behaviour log-probs, which scripted rollouts "
                "(rollout.backend=scripted) do not have: use auto or never"
            )
        _check_mi(self)
        _check_async(self)
        if self.rollout.training_rows == "turn" and algorithm.reward_level == "turn":
            raise ValueError(
                "rollout.training_rows=turn gives every turn row its trajectory's score (RAGEN-2); "
                "algorithm.reward_level=turn would need each turn's own reward: use reward_level=trajectory with "
                "turn rows, or training_rows=trajectory"
            )
        if self.env.max_actions_per_turn > self.env.max_actions_per_traj:
            raise ValueError(
                f"env.max_actions_per_turn={self.env.max_actions_per_turn} exceeds env.max_actions_per_traj="
                f"{self.env.max_actions_per_traj}; set it at most the trajectory budget"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """The resolved tree as plain JSON-compatible values."""
        return self.model_dump(mode="json")

    def config_hash(self) -> str:
        """Stable 16-hex-digit digest of the resolved config (sorted-key JSON), keys of :data:`LATER_KEYS` left out
        at the value that behaves as before they existed."""
        payload = json.dumps(self.hashed_tree(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def hashed_tree(self) -> dict[str, Any]:
        """The resolved tree as :meth:`config_hash` digests it: each key of :data:`LATER_KEYS` left out at the value
        that behaves as before it existed, the :data:`PLACEMENT_KEYS` at any value (what other identities, such as a
        bootstrap's, take from the config)."""
        tree = self.to_dict()
        for dotted in [*LATER_KEYS, *PLACEMENT_KEYS]:
            *sections, name = dotted.split(".")
            section = tree
            for part in sections:
                section = section[part]
            if dotted in PLACEMENT_KEYS or section.get(name, LATER_KEYS[dotted]) == LATER_KEYS[dotted]:
                section.pop(name, None)
        return tree


# Keys added after runs and findings stored their config hashes, each with the value at which a config behaves exactly
# as it did before the key existed. The hash leaves such a key out at that value, so a new feature that is off by
# default leaves every stored run's and finding's hash (and the trajectories' config_hash column) as it was; set to
# anything else, the key enters the hash. A key joins this table in the change that adds it, never later.
LATER_KEYS: dict[str, Any] = {
    "trainer.max_staleness": 0,
    "rollout.sampler_threads": 1,
    "algorithm.off_policy_correction": "none",
    "algorithm.is_cap": None,
    # a run that ends behaves as before; only code that never returns (which hung the run for ever) now fails it
    "env.user_code_timeout_s": 300.0,
    # read only by tool envs (docs/environments.md, "Tool environments"), which no earlier run played
    "env.tool_timeout_s": 10.0,
    "rollout.tool_parser": "hermes",
    "env.remote": None,  # the env played in this process, as before
    "env.mcp": None,  # the env's own tools only, as before
    "actor.lora": None,  # full fine-tuning, as before
    "model.adapter": None,  # the start model alone, as before
    "trainer.nnodes": 1,  # the launched group on this host alone, as before
    "rollout.vllm.shards": 1,  # each turn's requests as one, as before
}
# Keys that say where a run's processes meet, never what they compute: left out of the config hash and free to differ
# on resume (a requeued job's node 0 may be another host).
PLACEMENT_KEYS = ("trainer.rdzv_endpoint", "rollout.vllm.servers", "rollout.vllm.on_server_loss")


def _check_mi(config: RunConfig) -> None:
    """The MI diagnostic's keys must fit together (checked at load time)."""
    trainer = config.trainer
    if trainer.mi_multi_turn and not trainer.mi_diagnostic:
        raise ValueError("trainer.mi_multi_turn is part of the MI diagnostic: set trainer.mi_diagnostic=true too")
    if trainer.mi_samples is not None and not trainer.mi_multi_turn:
        raise ValueError("trainer.mi_samples sets the multi-turn sample's draws: set trainer.mi_multi_turn=true")
    if trainer.mi_multi_turn and config.rollout.context_window_mode != "full":
        raise ValueError(
            "trainer.mi_multi_turn scores each turn under the chat before it, which windowed rollouts "
            f"(rollout.context_window_mode={config.rollout.context_window_mode}) do not keep: use full (RAGEN-2 "
            "computes no collapse metric outside full)"
        )


def _check_async(config: RunConfig) -> None:
    """What an asynchronous run (``trainer.max_staleness`` >= 1) and the off-policy correction need (load time). The
    stages an async run cannot run are refused by the run's config check, from the rows of the iteration's table that
    say so (``ragen_core.run.schedule.SyncOnly``)."""
    algorithm, staleness = config.algorithm, config.trainer.max_staleness
    if algorithm.off_policy_correction != "none" and config.rollout.backend == "scripted":
        raise ValueError(
            f"algorithm.off_policy_correction={algorithm.off_policy_correction} weighs each token by the sampler's "
            "stored log-prob, which scripted rollouts (rollout.backend=scripted) do not have: use none"
        )
    if not staleness:
        return
    if algorithm.filter_entropy == "full" and algorithm.filter_metric in ("entropy", "entropy_variance"):
        raise ValueError(
            f"algorithm.filter_entropy=full scores each batch with the policy that sampled it, which an async run "
            f"(trainer.max_staleness={staleness}) keeps only in its sampler: use filter_entropy=sampled (the stored "
            "log-probs' estimate) or trainer.max_staleness=0"
        )


def _check_scale_out(config: RunConfig) -> None:
    """Launcher, processes and ZeRO stage must fit together (checked at load time)."""
    trainer, stage = config.trainer, config.actor.zero_stage
    if stage == 3 and trainer.launcher == "inprocess":
        raise ValueError(
            "actor.zero_stage=3 shards the weights over the processes of a launched group (and would slow every "
            "in-process generation): set trainer.launcher=torchrun or deepspeed, or use actor.zero_stage 0-2"
        )
    if (trainer.nproc > 1 or trainer.nnodes > 1 or trainer.hostfile) and stage == 0:
        raise ValueError(
            "a data-parallel update over several processes needs actor.zero_stage 1, 2 or 3 (ZeRO-0 would log only "
            "one rank's gradient norm)"
        )
