"""Rollout backend on Hugging Face ``generate``: batched sampling that records the sampler's own log-probs.

The sampling chain is explicit (temperature, then top-k, then top-p; nothing from the model's generation config),
and a processor at the end of the chain keeps the log-softmax of the final scores, so the recorded log-prob of each
sampled token is the one it was drawn with. Randomness: the global torch RNG is seeded right before the call.
"""

from __future__ import annotations

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

from ragen_core.rollout.types import Generation, TurnContext


class _LogprobStash(LogitsProcessor):
    """Last processor of the chain: remembers log-softmax of the scores the token will be sampled from."""

    def __init__(self) -> None:
        self.logprobs: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.logprobs = torch.log_softmax(scores.float(), dim=-1)
        return scores


class _LogprobCollector(StoppingCriteria):
    """Called after each sampling step: gathers the log-prob of the token just appended. Never stops generation."""

    def __init__(self, stash: _LogprobStash) -> None:
        self.stash = stash
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        assert self.stash.logprobs is not None
        self.steps.append(self.stash.logprobs.gather(1, input_ids[:, -1:]).squeeze(1))
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
    """Samples replies from a causal LM with ``model.generate``."""

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
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.stop_ids = stop_token_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

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
        """Sample one reply per context; the whole call is reproducible from ``seed``."""
        torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            results: list[Generation] = []
            for start in range(0, len(contexts), self.batch_size):
                results.extend(self._generate_batch([c.prompt_ids for c in contexts[start : start + self.batch_size]]))
            return results
        finally:
            self.model.train(was_training)

    def _generate_batch(self, prompts: list[list[int]]) -> list[Generation]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
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
        )
        sequences = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([collector]),
        )
        generated = sequences[:, width:].cpu()
        logprobs = torch.stack(collector.steps, dim=1).cpu() if collector.steps else torch.zeros_like(generated)
        stop = set(self.stop_ids)
        results = []
        for row in range(len(prompts)):
            tokens = generated[row].tolist()
            end = next((i + 1 for i, token in enumerate(tokens) if token in stop), None)
            truncated = end is None
            end = len(tokens) if end is None else end
            tokens = tokens[:end]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(Generation(tokens, logprobs[row, :end].tolist(), text, truncated))
        return results
