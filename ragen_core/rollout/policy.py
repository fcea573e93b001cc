"""The policy a session's rollouts use: the rollout copy of the model, its tokenizer and chat format, and the samplers
that sample from it, behind the rollout engine's backends (:class:`RolloutPolicy`).

:func:`open_rollout_policy` opens it for a session: the backend ``rollout.backend`` names
(:data:`ragen_core.rollout.samplers.BACKENDS`) opens the session's sampler; when the run samples its training
batches beside the learner (the schedule says so: an async run), a backend whose sampler reads the learner's own
module opens a second one that holds a copy of its own (the Hugging Face backend's sampler process).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_core.agent import ChatFormatter
from ragen_core.config import RolloutConfig, RunConfig
from ragen_core.rollout.samplers import BACKENDS, RolloutSetup
from ragen_core.rollout.sampling import NewWeights, Sampler, SamplerBackend, Sampling


@dataclass
class RolloutPolicy:
    """The rollout side of a session: the policy the rollouts sample from (``model``, the rollout copy: the
    learner's own module in process, or a copy the updater keeps at the current weights), its tokenizer and chat
    format, the session's ``sampler`` (validation rollouts, and the training ones unless the run has a
    ``training_sampler`` of its own, which samples beside the learner) and the weights the samplers took last."""

    model_dir: Path  # the model the run started from
    tokenizer: Any
    formatter: ChatFormatter
    model: Any  # torch.nn.Module
    sampler: Sampler
    training_sampler: Sampler | None = None  # an async run's training batches, beside the learner
    current: NewWeights = field(init=False)  # what the samplers hold: the start weights until the updater hands more

    def __post_init__(self) -> None:
        start = self.model_dir
        self.current = NewWeights(self.model, lambda: start, version=0)

    def backend(self, rollout: RolloutConfig, temperature: float) -> SamplerBackend:
        """The session's sampler at the config's settings and ``temperature`` (the rollout engine's backend)."""
        return SamplerBackend(self.sampler, Sampling.of(rollout, temperature))

    def training_backend(self, rollout: RolloutConfig) -> SamplerBackend:
        """The backend of the training rollouts, at ``rollout.temperature``: the training sampler's when the run has
        one (an async run), else :meth:`backend`'s."""
        if self.training_sampler is None:
            return self.backend(rollout, rollout.temperature)
        return SamplerBackend(self.training_sampler, Sampling.of(rollout, rollout.temperature))

    def take(self, weights: NewWeights) -> None:
        """The updater hands over new weights (``Updater.sync``: the rollout copy already holds them): the session's
        sampler takes them. A training sampler of its own takes them only at the hand-off (:meth:`hand_off`)."""
        self.current = weights
        self.sampler.load(weights)

    def relabel(self, version: int) -> None:
        """The weights the samplers hold stand for policy ``version`` from now on, unchanged (an iteration that
        trained nothing: skipped on resume, or its filter kept no group): the session's sampler relabels them
        (``relabel(weights)``, a sampler that would otherwise reload them: the vLLM server) or takes them again."""
        self.current = dataclasses.replace(self.current, version=version)
        relabel = getattr(self.sampler, "relabel", None)
        if relabel is not None:
            relabel(self.current)
        else:
            self.sampler.load(self.current)

    def hand_off(self) -> None:
        """The training sampler of its own, if any, takes the weights the session's sampler holds (an async run's
        hand-off; the schedule says when)."""
        if self.training_sampler is not None:
            self.training_sampler.load(self.current)

    def close(self) -> None:
        """Stop the samplers (idempotent; the session's sampler even when the training one's stop fails)."""
        try:
            if self.training_sampler is not None:
                self.training_sampler.close()
                self.training_sampler = None
        finally:
            self.sampler.close()


def check_backend(config: RunConfig, data_root: Path) -> None:
    """What ``rollout.backend`` needs before a session loads anything is there (its registered ``check``)."""
    check = BACKENDS.get(config.rollout.backend).check
    if check is not None:
        check(config, data_root)


def open_rollout_policy(setup: RolloutSetup, formatter: ChatFormatter, beside_learner: bool) -> RolloutPolicy:
    """The rollout side of a new session: the sampler of ``rollout.backend`` and, when the run samples its training
    batches ``beside_learner`` and the backend's sampler reads the learner's module, a training sampler of its own."""
    backend = BACKENDS.get(setup.config.rollout.backend)
    training = backend.beside_learner(setup) if beside_learner and backend.beside_learner is not None else None
    try:
        sampler = backend.open(setup)
    except BaseException:
        if training is not None:
            training.close()
        raise
    return RolloutPolicy(setup.model_dir, setup.tokenizer, formatter, setup.model, sampler, training)
