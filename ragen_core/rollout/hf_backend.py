"""Rollout backend on Hugging Face ``generate``: batched sampling that records the sampler's own log-probs.

The sampling chain is explicit (temperature, then top-k, then top-p; nothing from the model's generation config),
and a processor at the end of the chain keeps the final scores, so the recorded log-prob of each sampled token is the
one it was drawn with. Randomness: the global torch RNG is seeded right before the call. Within one rollout no token
is encoded twice: shared first prompts are encoded once per group and later turns continue the previous turn's
key/value cache (:mod:`ragen_core.rollout.kv_reuse`); the engine calls :meth:`HFBackend.reset` around each rollout.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ragen_core.rollout.kv_reuse import (
    Chunk,
    ChunkState,
    continued_inputs,
    left_padded,
    plan_chunks,
    shared_prefix_cache,
)
from ragen_core.rollout.types import Generation, TurnContext


class _LogprobStash(LogitsProcessor):
    """Last processor of the chain: keeps the final scores the token will be sampled from (a reference, no copy)."""

    def __init__(self) -> None:
        self.scores: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.scores = scores
        return scores


class _LogprobCollector(StoppingCriteria):
    """Called after each sampling step: the log-prob of the token just appended under the stashed scores,
    ``score[token] - logsumexp(scores)`` (log-softmax at one entry, without materialising the whole row). Never
    stops generation."""

    def __init__(self, stash: _LogprobStash) -> None:
        self.stash = stash
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        stashed = self.stash.scores
        if stashed is None:
            raise RuntimeError("the log-prob stash saw no scores; it must be the last logits processor")
        stashed = stashed.float()
        picked = stashed.gather(1, input_ids[:, -1:]).squeeze(1)
        self.steps.append(picked - torch.logsumexp(stashed, dim=-1))
        self.stash.scores = None
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a reply: the tokenizer's eos plus ChatML's end markers when the vocabulary has them."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    if not ids:
        raise ValueError("the tokenizer defines no end-of-sequence token; set tokenizer.eos_token")
    return sorted(ids)


class HFBackend:
    """Samples replies from a causal LM with ``model.generate``.

    ``reuse_cache`` keeps each call's key/value cache for the next turn of the same rollout (see
    :mod:`ragen_core.rollout.kv_reuse`). What guarantees that a cache never outlives its weights is :meth:`reset`,
    which the engine calls before and after every rollout (updates happen between rollouts); as a second guard the
    caches are also dropped when a parameter's version counter moved (in-place updates through torch ops, e.g.
    ``torch.optim`` steps and ``load_state_dict``; writes through ``.data``, as some DeepSpeed optimizers do, are not
    counted).
    """

    behavior_source = "policy"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_size: int = 128,
        reuse_cache: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.reuse_cache = reuse_cache
        self.stop_ids = stop_token_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self._states: list[ChunkState] = []
        self._weights_version: int | None = None

    def reset(self) -> None:
        """Forget the kept caches (the start or end of a rollout)."""
        self._states, self._weights_version = [], None

    def _version(self) -> int:
        """Sum of the parameters' version counters (moved by in-place torch ops on them, not by ``.data`` writes)."""
        return sum(p._version for p in self.model.parameters())

    def _processors(self) -> tuple[LogitsProcessorList, _LogprobStash]:
        chain: list[LogitsProcessor] = []
        if self.temperature != 1.0:
            chain.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            chain.append(TopKLogitsWarper(self.top_k))
        if self.top_p < 1.0:
            chain.append(TopPLogitsWarper(self.top_p))
        stash = _LogprobStash()
        chain.append(stash)
        return LogitsProcessorList(chain), stash

    @torch.no_grad()
    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """Sample one reply per context; the whole call is reproducible from ``seed`` (and the rollout so far)."""
        torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            version = self._version()
            states = self._states if self.reuse_cache and version == self._weights_version else []
            prompts = [c.prompt_ids for c in contexts]
            results: list[Generation | None] = [None] * len(contexts)
            kept: list[ChunkState] = []
            for chunk in plan_chunks(prompts, states, self.batch_size):
                generations, state = self._generate_chunk(chunk, prompts)
                for index, generation in zip(chunk.indices, generations, strict=True):
                    results[index] = generation
                if state is not None:
                    kept.append(state)
            self._states, self._weights_version = kept, version
            return [r for r in results if r is not None]
        finally:
            self.model.train(was_training)

    def _generate_chunk(self, chunk: Chunk, prompts: list[list[int]]) -> tuple[list[Generation], ChunkState | None]:
        device = next(self.model.parameters()).device
        if chunk.previous is None:
            chunk_prompts = [prompts[i] for i in chunk.indices]
            if self.reuse_cache:
                input_ids, attention_mask, cache = shared_prefix_cache(self.model, chunk_prompts, self.pad_id, device)
            else:
                input_ids, attention_mask, cache = *left_padded(chunk_prompts, self.pad_id, device), None
        else:
            input_ids, attention_mask, cache = continued_inputs(chunk, prompts, self.pad_id)
        processors, stash = self._processors()
        collector = _LogprobCollector(stash)
        config = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
        )
        with warnings.catch_warnings():
            # transformers >= 5.2x renames generate's past_key_values to cache and warns on the old name, which every
            # supported version (>= 4.51, < 6) still takes; the new name is unknown before the rename
            warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([collector]),
                **({"past_key_values": cache} if cache is not None else {}),
            )
        width = input_ids.shape[1]
        generated = out.sequences[:, width:]
        logprobs = torch.stack(collector.steps, dim=1) if collector.steps else torch.zeros_like(generated).float()
        # each reply ends after its first stop token (a row that never stops was cut at the length limit)
        stopped = torch.isin(generated, torch.tensor(self.stop_ids, device=generated.device))
        ends = torch.where(stopped.any(dim=1), stopped.int().argmax(dim=1) + 1, generated.shape[1])
        finished = stopped.any(dim=1).tolist()
        results = []  # one device -> host copy per tensor, then Python lists
        for tokens, row_logprobs, end, done in zip(
            generated.cpu().tolist(), logprobs.cpu().tolist(), ends.tolist(), finished, strict=True
        ):
            tokens = tokens[:end]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(Generation(tokens, row_logprobs[:end], text, truncated=not done))
        return results, self._keep(chunk, prompts, out, attention_mask, ends, results)

    def _keep(
        self, chunk: Chunk, prompts: list[list[int]], out: Any, mask: torch.Tensor, ends: torch.Tensor, results: list
    ) -> ChunkState | None:
        """The state a next turn continues from (None without reuse, or if the cache does not cover the layout)."""
        cache = getattr(out, "past_key_values", None)
        if not self.reuse_cache or cache is None or cache.get_seq_length() != out.sequences.shape[1] - 1:
            return None
        steps = out.sequences.shape[1] - mask.shape[1]
        reply_mask = (torch.arange(steps, device=mask.device)[None, :] < ends[:, None].to(mask.device)).long()
        rows = [prompts[i] for i in chunk.indices]
        ids = [list(prompt) + generation.token_ids for prompt, generation in zip(rows, results, strict=True)]
        return ChunkState(rows, ids, out.sequences, torch.cat([mask, reply_mask], dim=1), cache)
