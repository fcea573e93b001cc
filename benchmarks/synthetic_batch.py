"""The GPU bench's batch without sampling: replies of the shape a random-weight model gives, drawn from seeds.

The update bench measures the update, not the rollouts; sampling its batch from the 0.47B model with the Hugging
Face backend took most of a bench's ~140 s on an H100, so the launched bench ran out of its time before its first
update. :class:`SyntheticBackend` replaces the sampler (the run's envs, prompts, filter and update are the real
ones): each reply is as long as a random-weight model's (it draws the stop token with probability 1/V per token, V
the vocabulary: with the benches' ~1k-token vocabulary 88% of 128-token replies run to the limit, as the sampled
batches did), made of random filler thinking and a valid answer naming one random action, then the stop token, so
the env's rewards vary as a random policy's do. Token ids, lengths, actions and so rewards derive from (the call's
seed, the reply's index), as the real backends' draws do, so every process (in-process, or the driver of a launched
group) builds the identical batch from the same config.

Measured against batches sampled from random-weight models (2026-11-27, CPU): Bandit, 128 rows of 169-288 tokens,
~36k tokens, 32 kept rows of 8.8-9.1k tokens against 8.9-9.1k sampled; Sokoban (tiny shape), 128 rows, median 1531
tokens against 1586, 32 kept rows of 47.5k tokens against 49.7k (-4%): random valid moves now and then solve a room
and end its trajectory early, while a random-weight model never answers validly, so its rollouts all run five turns
with equal rewards (no advantage to train on).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from benchmarks.common import patched
from ragen_core.rollout.scripted import format_reply
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.seeding import derive_seed


class SyntheticBackend:
    """A rollout backend of random replies of a random-weight model's lengths, each ending with a valid answer."""

    behavior_source = "policy"

    def __init__(self, tokenizer: Any, max_new_tokens: int) -> None:
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.filler = filler_ids(tokenizer)
        self.logprob = -math.log(len(tokenizer))  # a uniform draw's: what a random-weight model assigns, roughly

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """One reply per context, drawn from (``seed``, its index)."""
        return [self._reply(c, np.random.default_rng(derive_seed(seed, index))) for index, c in enumerate(contexts)]

    def _reply(self, context: TurnContext, rng: np.random.Generator) -> Generation:
        text = format_reply([context.env.sample_action(rng)], context.enable_think, think="")
        if context.reply_prefix and text.startswith(context.reply_prefix):  # the prompt already ends with it
            text = text[len(context.reply_prefix) :]
        head, _, tail = text.partition("</think>") if context.enable_think else ("", "", text)
        head_ids = self._encode(head)
        tail_ids = self._encode(("</think>" if context.enable_think else "") + tail)
        length = min(int(rng.geometric(1 / len(self.tokenizer))), self.max_new_tokens)  # where the stop token falls
        room = max(0, length - len(head_ids) - len(tail_ids) - 1)
        thinking = [int(t) for t in rng.choice(self.filler, size=room)]
        ids = head_ids + thinking + tail_ids + [self.tokenizer.eos_token_id]
        decoded = self.tokenizer.decode(ids[:-1], skip_special_tokens=True)
        return Generation(ids, [self.logprob] * len(ids), decoded, truncated=False)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []


def filler_ids(tokenizer: Any) -> np.ndarray:
    """Token ids for the filler thinking: no special token and none whose text holds ``<`` or ``>`` (so the filler
    never opens or closes a tag, and the reply parses as its answer)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special and not set(tokenizer.decode([i])) & {"<", ">"}]
    return np.array(ids, dtype=np.int64)


@contextmanager
def synthetic_rollouts() -> Iterator[None]:
    """Within the block, every run of this process samples with :class:`SyntheticBackend` (training and validation
    rollouts; a launched update group's processes sample nothing)."""
    from ragen_core.rollout.policy import RolloutPolicy

    def backend(policy: RolloutPolicy, rollout: Any, temperature: float) -> SyntheticBackend:
        return SyntheticBackend(policy.tokenizer, rollout.max_new_tokens)

    with patched(RolloutPolicy, "backend", backend):
        yield
