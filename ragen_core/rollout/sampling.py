"""The rollout room's one interface: a :class:`Sampler` samples a turn's prompts, takes new weights, and closes.

Every place a run's replies come from is a sampler: Hugging Face ``generate`` in this process, the sampler process of
an async run (:mod:`ragen_core.rollout.sampler`), the vLLM rollout server, a scripted policy
(:mod:`ragen_core.rollout.samplers` registers them by ``rollout.backend``). The run layer never sees which: it asks the
session's :class:`~ragen_core.rollout.policy.RolloutPolicy` for a backend of the rollout engine
(:func:`ragen_core.rollout.run_rollouts`), which is a sampler at fixed sampling settings (:class:`SamplerBackend`), and
the updater hands the new weights to the policy, which hands them to its samplers (:class:`NewWeights`). A new
backend (an adapter-aware one, a remote server) is a class with these three methods, registered by name; nothing of
``ragen_core/run`` changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ragen_core.config import RolloutConfig
from ragen_core.rollout.types import Generation, TurnContext


@dataclass(frozen=True)
class Sampling:
    """The settings a turn's replies are sampled at (a rollout's ``temperature``, its token limit, top-p, top-k)."""

    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    top_k: int = 0

    @classmethod
    def of(cls, rollout: RolloutConfig, temperature: float) -> Sampling:
        """The config's sampling settings at ``temperature`` (training rollouts: ``rollout.temperature``;
        validation: ``eval.temperature``)."""
        return cls(temperature, rollout.max_new_tokens, rollout.top_p, rollout.top_k)


def _no_export() -> Path:
    raise RuntimeError("these weights have no Hugging Face export: a sampler that reloads a folder needs one")


@dataclass(frozen=True)
class NewWeights:
    """New weights of the policy, as the updater hands them to the rollout side: ``module``, the rollout copy that
    holds them, and ``export()``, their Hugging Face folder (written when first asked: a server reloads a folder,
    a sampler that reads the module never asks)."""

    module: Any  # torch.nn.Module
    export: Callable[[], Path] = _no_export


class Sampler(Protocol):
    """Where a run's replies are sampled. ``behavior_source`` says what its replies carry: ``"policy"``, the
    sampler's log-prob of every token; ``"scripted"``, none. A sampler may also define ``reset()``: it forgets what
    it keeps between the turns of a rollout (key/value caches, a server's prefix cache), and the engine calls it
    before and after every rollout, so no rollout depends on what the sampler did before it."""

    behavior_source: str

    def generate(self, contexts: list[TurnContext], seed: int, sampling: Sampling) -> list[Generation]:
        """One reply per context of a turn (in order), sampled at ``sampling``; ``seed`` fixes every random draw
        of the call."""
        ...

    def load(self, weights: NewWeights) -> None:
        """Take ``weights``: the replies sampled after this call are the new policy's."""
        ...

    def close(self) -> None:
        """Stop what the sampler started (a process, a server); idempotent."""
        ...


@dataclass(frozen=True)
class SamplerBackend:
    """A sampler at fixed sampling settings: the rollout engine's backend (``generate(contexts, seed)``, ``reset()``,
    ``behavior_source``: :class:`ragen_core.rollout.RolloutBackend`)."""

    sampler: Sampler
    sampling: Sampling

    @property
    def behavior_source(self) -> str:
        """What the sampler's replies carry (:class:`Sampler`)."""
        return self.sampler.behavior_source

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """One reply per context, sampled at this backend's settings."""
        return self.sampler.generate(contexts, seed, self.sampling)

    def reset(self) -> None:
        """The sampler's ``reset()``, when it has one (before and after every rollout)."""
        reset = getattr(self.sampler, "reset", None)
        if reset is not None:
            reset()
