"""The updater: who holds the training engines and steps them, behind one interface.

A run updates its policy through an :class:`Updater` and never asks where the engines live:

- :class:`InProcessUpdater`: the DeepSpeed actor (and critic) in this process; the rollouts sample from the actor's
  own module, so there is nothing to copy after an update;
- :class:`LaunchedUpdater`: the engines in a group of processes started by ``torchrun`` or the ``deepspeed``
  launcher (:mod:`ragen_core.training.group`); every rank runs an :class:`InProcessUpdater`, and this process keeps a
  copy of the policy for the rollouts that takes the group's new weights from shared memory after every update
  (:mod:`ragen_core.training.handoff`).

Both read an iteration's kept rows from the lake (:mod:`ragen_core.update.inputs`), save checkpoints laid out as
:mod:`ragen_core.training.checkpoint` does, restore from one (replaying later committed updates from their stored
batches) and bring the rollout side to the new weights (:meth:`Updater.sync`; a vLLM server reloads an export and is
checked against the trainer's model).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Protocol

import torch

from ragen_core.agent.prompts import reply_prefix as prompt_reply_prefix
from ragen_core.agent.spans import think_mask
from ragen_core.algos.advantages import needs_critic
from ragen_core.config import RunConfig
from ragen_core.faults import maybe_fail
from ragen_core.rollout.handoff import SharedWeights, WeightLayout
from ragen_core.rollout.sampling import NewWeights
from ragen_core.seeding import derive_seed
from ragen_core.storage import DataLake
from ragen_core.training.actor import ActorEngine
from ragen_core.training.checkpoint import export_policy, load_checkpoint, load_exported_weights, save_checkpoint
from ragen_core.training.cost import UpdateClock, critic_passes
from ragen_core.training.critic import CriticEngine
from ragen_core.training.engines import policy_copy, start_engines
from ragen_core.training.precision import torch_dtype
from ragen_core.training.starpo import critic_schedule, starpo_update
from ragen_core.update.inputs import update_inputs

SKIPPED = {"actor/skipped_update": 1.0}  # the filter kept no group (RAGEN's empty_after_filter): nothing trained


class RolloutSide(Protocol):
    """What an updater syncs after an update (:class:`ragen_core.rollout.policy.RolloutPolicy`): the rollout copy of
    the policy, which the updater brings to the new weights, and ``take``, which hands them on to the samplers."""

    model: torch.nn.Module

    def take(self, weights: NewWeights) -> None:
        """The new weights, held by ``model`` now."""
        ...


class Updater(Protocol):
    """The training side of a run. ``version`` is the policy version its weights stand for, which every hand-off to
    the rollout side carries (:class:`~ragen_core.rollout.sampling.NewWeights`): iteration n's update makes it
    n + 1 (whether or not the filter kept anything to train on); a resume sets it to the iterations committed (one
    skipped on resume counts: it changed no weight)."""

    version: int

    def update(self, iteration: int) -> dict[str, float]:
        """One StarPO update on ``iteration``'s published, kept rows; its metrics (``SKIPPED`` if none was kept)."""
        ...

    def save(self, updates: int, extra: dict[str, Any]) -> Path:
        """A checkpoint after ``updates`` updates (``extra``: recorded in its info file); its folder."""
        ...

    def restore(self, checkpoint: Path | None, replay: list[int]) -> None:
        """Load ``checkpoint`` (None: keep the start weights), then replay the updates of ``replay`` in order (the
        caller sets :attr:`version` to the iterations they stand for)."""
        ...

    def sync(self, rollout: RolloutSide) -> None:
        """Bring the rollout side to the current weights."""
        ...

    def rollout_policy(self, model_dir: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
        """(model, tokenizer) the rollouts sample from."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """What the run manifest records about the engines' processes (None: this process)."""
        ...

    def close(self) -> None:
        """Stop what the updater started (idempotent)."""
        ...


class InProcessUpdater:
    """The engines in this process (also what every rank of a launched group runs)."""

    def __init__(
        self,
        config: RunConfig,
        lake: DataLake,
        run_id: str,
        actor: ActorEngine,
        critic: CriticEngine | None,
        tokenizer: Any,
    ) -> None:
        self.config, self.lake, self.run_id = config, lake, run_id
        self.actor, self.critic, self.tokenizer = actor, critic, tokenizer
        self.version = 0  # the policy version the weights stand for (:class:`Updater`)

    @classmethod
    def start(
        cls, config: RunConfig, lake: DataLake, run_id: str, model_dir: Path, precision: str, training: bool = True
    ) -> InProcessUpdater:
        """Engines from ``model_dir``; ``training=False`` (evaluation) skips the KL reference copy and the critic."""
        actor, critic, tokenizer = start_engines(config, model_dir, precision, training)
        return cls(config, lake, run_id, actor, critic, tokenizer)

    def update(self, iteration: int) -> dict[str, float]:
        self.version = iteration + 1  # whether or not the filter kept anything to train on
        with self.clock() as clock:  # from the lake read to the last optimizer step
            inputs = update_inputs(self.lake, self.run_id, iteration, self.config, self.tokenizer.pad_token_id)
            if inputs is None:
                return dict(SKIPPED)
            algorithm = self.config.algorithm
            if algorithm.kl_coef > 0 and algorithm.kl_span == "think":
                batch = inputs.batch
                mask = think_mask(batch.input_ids.tolist(), batch.loss_mask.tolist(), self.tokenizer.decode)
                inputs = dataclasses.replace(inputs, kl_mask=torch.from_numpy(mask))
            lora = self.config.actor.lora
            if lora is not None and lora.dropout > 0:  # a resume replays updates without the generation's reseed
                torch.manual_seed(derive_seed(self.config.seed, iteration, "update_dropout"))
            metrics = starpo_update(self.config, self.actor, self.critic, inputs, iteration)
            if self.critic is not None and needs_critic(algorithm.adv_estimator):
                clock.add(critic_passes(self.critic.module, inputs.batch, critic_schedule(self.config).ppo_epochs))
        return {**metrics, **clock.metrics()}

    def clock(self) -> UpdateClock:
        """The clock of one update of these engines: its ``perf/*`` metrics (:mod:`ragen_core.training.cost`)."""
        return UpdateClock([self.actor, self.critic], self.actor.device, torch_dtype(self.actor.optim.precision))

    def save(self, updates: int, extra: dict[str, Any]) -> Path:
        return save_checkpoint(
            self.lake, self.run_id, updates, self.actor, self.critic, self.tokenizer, extra, self.reply_prefix
        )

    def restore(self, checkpoint: Path | None, replay: list[int]) -> None:
        if checkpoint is not None:
            load_checkpoint(checkpoint, self.actor, self.critic)
        for iteration in replay:
            self.update(iteration)  # same stored batch, same seeds, same starting weights: same update

    def export(self) -> Path:
        """The policy as a Hugging Face folder (the run's policy export), for a vLLM engine or the run's process."""
        return export_policy(self.actor, self.tokenizer, self.lake.policy_export_dir(self.run_id), self.reply_prefix)

    def sync(self, rollout: RolloutSide) -> None:
        export = functools.cache(self.export)  # once at most, when the copy or a sampler (a vLLM server) reads it
        if rollout.model is not self.actor.module:  # a separate copy (not how a run builds it, but kept exact)
            load_exported_weights(rollout.model, export())
        rollout.take(NewWeights(rollout.model, export, self.version))

    def rollout_policy(self, model_dir: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
        return self.actor.module, self.tokenizer  # the rollouts sample from the actor's own module

    @property
    def reply_prefix(self) -> str:
        """What the run's prompts end with after the assistant header; its exports' chat template adds it too."""
        return prompt_reply_prefix(self.config.rollout.enable_think, self.config.rollout.think_prefix)

    def describe(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        pass


class LaunchedUpdater:
    """The engines in a launched group of processes; this process sends commands and brings its rollout copy to the
    group's newest weights: from the shared-memory buffer rank 0 writes after every update
    (:mod:`ragen_core.rollout.handoff`), or from the export a restore writes. A vLLM rollout side also gets an
    export after every update (its server reloads a folder)."""

    def __init__(self, group: Any, config: RunConfig, exports: bool = False) -> None:
        self.group, self.config = group, config
        self.launcher, self.nproc = config.trainer.launcher, config.trainer.nproc
        self.exports = exports  # a Hugging Face export after every update (the rollout side needs a folder)
        self.weights: Path | None = None  # the group's newest export, not yet synced
        self.shared: SharedWeights | None = None  # the group's weights buffer, mapped here
        self.shared_fresh = False  # the buffer holds weights the rollout side has not taken yet
        self.version = 0  # the policy version the group's weights stand for (:class:`Updater`)
        ready = group.ready.get("shared_weights")
        if ready:
            self.shared = SharedWeights.attach(ready["path"], WeightLayout.from_json(ready["layout"]))
            self.shared.unlink()  # both processes map it: the memory lives while either does, no file is left

    @classmethod
    def start(cls, config: RunConfig, lake: DataLake, run_id: str, model_dir: Path, precision: str) -> LaunchedUpdater:
        """Launch ``trainer.nproc`` processes per node (this host's; with ``trainer.nnodes`` > 1 the other nodes join
        at ``trainer.rdzv_endpoint``); every rank builds its engines from ``model_dir``."""
        from ragen_core.training.group import UpdateGroup

        trainer = config.trainer
        init = {
            "config": config.to_dict(),
            "data_root": str(lake.root),
            "run_id": run_id,
            "model_dir": str(model_dir),
            "precision": precision,
            "shared_weights": True,
        }
        folder = lake.update_group_dir(run_id)
        group = UpdateGroup.start(
            trainer.launcher, trainer.nproc, trainer.hostfile, folder, init, trainer.nnodes, trainer.rdzv_endpoint
        )
        try:
            # a vLLM server reloads a whole policy from its export; a LoRA policy's adapters it gets from the copy
            return cls(group, config, exports=config.rollout.backend == "vllm" and config.actor.lora is None)
        except BaseException:
            group.stop()
            raise

    def update(self, iteration: int) -> dict[str, float]:
        metrics, weights = self.group.update(iteration, export=self.exports or self.shared is None)
        self.weights, self.shared_fresh = weights, self.shared is not None
        self.version = iteration + 1
        maybe_fail("update", "inside", iteration)  # the group has stepped; nothing is saved or committed
        return metrics

    def save(self, updates: int, extra: dict[str, Any]) -> Path:
        return self.group.save(updates, extra, lambda: maybe_fail("checkpoint", "mid_save", updates))

    def restore(self, checkpoint: Path | None, replay: list[int]) -> None:
        self.weights, self.shared_fresh = self.group.restore(checkpoint, replay), False

    def sync(self, rollout: RolloutSide) -> None:
        if self.shared_fresh and self.shared is not None:
            self.shared.read_into(rollout.model)
        elif self.weights is not None:
            load_exported_weights(rollout.model, self.weights)
        else:
            return
        rollout.take(NewWeights(rollout.model, functools.partial(_exported, self.weights), self.version))
        self.weights, self.shared_fresh = None, False

    def rollout_policy(self, model_dir: Path, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
        model, tokenizer = policy_copy(
            self.config, model_dir, dtype
        )  # the start policy, as the group's ranks build it
        return model.to(rollout_device()).eval(), tokenizer

    def describe(self) -> dict[str, Any] | None:
        return {"launcher": self.launcher, "nproc": self.nproc, **self.group.describe()}

    def close(self) -> None:
        self.group.stop()


def _exported(folder: Path | None) -> Path:
    """The group's export of the weights it handed over; none was asked for when only shared memory carried them."""
    if folder is None:
        raise RuntimeError("the launched group handed these weights over in shared memory, without an export")
    return folder


def start_updater(
    config: RunConfig, lake: DataLake, run_id: str, model_dir: Path, precision: str, training: bool = True
) -> Updater:
    """The updater ``trainer.launcher`` asks for (evaluation runs, ``training=False``, always run in-process)."""
    if training and config.trainer.launcher != "inprocess":
        return LaunchedUpdater.start(config, lake, run_id, model_dir, precision)
    return InProcessUpdater.start(config, lake, run_id, model_dir, precision, training)


def rollout_device() -> torch.device:
    """Where this process's rollout copy of the policy runs: the first visible GPU, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
