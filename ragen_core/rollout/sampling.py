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
    holds them, ``export()``, their Hugging Face folder (written when first asked: a server reloads a folder,
    a sampler that reads the module never asks), and ``version``, the updates they have received (the policy
    version the rows they sample carry; None where nobody counts, as for a copy made by hand)."""

    module: Any  # torch.nn.Module
    export: Callable[[], Path] = _no_export
    version: int | None = None


class PolicyVersionError(RuntimeError):
    """A training batch was about to be sampled, or was sampled, by weights of another policy version than the
    schedule names (a hand-off missed or come in the middle of the batch): nothing of the batch is stored."""


def check_version(backend: SamplerBackend, expected: int, what: str) -> None:
    """The contract between the schedule and the rollout side: ``backend``'s sampler holds the policy after
    ``expected`` updates, the version the rows of ``what`` will carry; else a :class:`PolicyVersionError` in one
    line. A sampler that counts no versions (a scripted policy, a backend of a user's own without ``version``) is
    not checked."""
    held = getattr(backend, "version", None)
    if held is not None and held != expected:
        raise PolicyVersionError(
            f"{what} is sampled by the policy after {expected} updates, but its sampler holds the weights after "
            f"{held}: a weight hand-off was missed or came in the middle of the batch; nothing of the batch is "
            "stored, and `ragen resume` samples it again"
        )


class Sampler(Protocol):
    """Where a run's replies are sampled. ``behavior_source`` says what its replies carry: ``"policy"``, the
    sampler's log-prob of every token; ``"scripted"``, none. A sampler may also define ``reset()``: it forgets what
    it keeps between the turns of a rollout (key/value caches, a server's prefix cache), and the engine calls it
    before and after every rollout, so no rollout depends on what the sampler did before it. A sampler of weights
    also keeps ``version``: the updates the weights it samples with have received (``NewWeights.version`` of its last
    :meth:`load`), which :func:`check_version` holds against the schedule's; None, or no such attribute: not
    counted."""

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

    @property
    def version(self) -> int | None:
        """The policy version the sampler holds (:class:`Sampler`; None: not counted)."""
        return getattr(self.sampler, "version", None)

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """One reply per context, sampled at this backend's settings."""
        return self.sampler.generate(contexts, seed, self.sampling)

    def reset(self) -> None:
        """The sampler's ``reset()``, when it has one (before and after every rollout)."""
        reset = getattr(self.sampler, "reset", None)
        if reset is not None:
            reset()
