"""Rollout efficiency: generated tokens per second of our rollout engine divided by bare ``model.generate`` on the
same prompts, batch and sampling settings.

Ours is :func:`ragen_core.rollout.run_rollouts` with the Hugging Face backend (env steps, parsing, prompt building,
behaviour log-probs, records). Bare is a loop of ``model.generate`` calls on exactly the prompts our engine issued
(recorded in an untimed run with the same seed), left-padded beforehand, with the same generation config and the same
seed before each call, so both sides sample the same tokens (checked: ``same_tokens``; rounding differences between
cached and fresh encodings could in principle flip a sample, which the check would show). Bare encodes every prompt of
every call in full (it keeps nothing between calls); ours encodes each distinct first prompt once per group and
continues the previous turn's key/value cache (:mod:`ragen_core.rollout.kv_reuse`), so where prompts are shared or
histories grow it does less work than bare and the ratio can exceed 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from benchmarks.common import interleave, profile_top, ratio_of_rates, spread
from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend, stop_token_ids
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.seeding import derive_seeds

# (env, turns, max_actions_per_turn, max_actions_per_traj, max_new_tokens): configs/bandit.yaml, configs/sokoban.yaml
CASES: dict[str, tuple[str, int, int, int, int]] = {
    "bandit": ("bandit", 1, 1, 1, 32),
    "sokoban": ("sokoban", 5, 5, 10, 48),
}


@dataclass(frozen=True)
class RolloutCase:
    """One side-by-side measurement: a model, an environment case and the batch."""

    shape: str
    case: str
    groups: int
    group_size: int
    repeats: int
    seed: int = 0


class _Recorder:
    """Wraps a backend for one untimed run and keeps the prompts and seed of every ``generate`` call."""

    def __init__(self, backend: HFBackend) -> None:
        self.backend = backend
        self.behavior_source = backend.behavior_source
        self.calls: list[tuple[list[list[int]], int]] = []

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        self.calls.append(([list(c.prompt_ids) for c in contexts], seed))
        return self.backend.generate(contexts, seed)


def spec_for(case: str, groups: int, group_size: int, seed: int) -> RolloutSpec:
    """The rollout spec of a benchmark case (the limits of its config file)."""
    env, turns, per_turn, per_traj, _ = CASES[case]
    seeds = derive_seeds(seed, groups, "bench", case)
    return RolloutSpec(env, seeds, group_size, turns, per_turn, per_traj)


class BareGenerate:
    """``model.generate`` on pre-padded prompts: the raw engine our rollout stage is compared with."""

    def __init__(self, model: Any, tokenizer: Any, calls: list[tuple[list[list[int]], int]], max_new_tokens: int):
        self.model = model
        device = next(model.parameters()).device
        self.stop = torch.tensor(stop_token_ids(tokenizer), device=device)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(self.stop[0])
        self.config = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop.tolist(),
            pad_token_id=pad,
        )
        self.batches = []
        for prompts, seed in calls:
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), pad, dtype=torch.long)
            mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for row, prompt in enumerate(prompts):
                ids[row, width - len(prompt) :] = torch.tensor(prompt)
                mask[row, width - len(prompt) :] = 1
            self.batches.append((ids.to(device), mask.to(device), seed))

    @torch.no_grad()
    def __call__(self) -> int:
        """Generate every recorded call; return the generated tokens (up to and including each reply's stop)."""
        self.model.eval()
        tokens = 0
        for ids, mask, seed in self.batches:
            torch.manual_seed(seed)
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self.config)
            new = out[:, ids.shape[1] :]
            stopped = torch.isin(new, self.stop)
            first = torch.where(stopped.any(1), stopped.int().argmax(1) + 1, new.shape[1])
            tokens += int(first.sum())
        return tokens


def measure(case: RolloutCase, model: Any, tokenizer: Any) -> dict[str, Any]:
    """Interleaved repeats of ours and bare on one case; rates, per-repeat ratios and a profile of ours."""
    max_new_tokens = CASES[case.case][4]
    spec = spec_for(case.case, case.groups, case.group_size, case.seed)
    formatter = ChatFormatter(tokenizer)
    backend = HFBackend(model, tokenizer, 1.0, max_new_tokens, batch_size=case.groups * case.group_size)
    recorder = _Recorder(backend)
    run_rollouts(spec, recorder, formatter, case.seed)  # records the prompts; also warms up
    bare = BareGenerate(model, tokenizer, recorder.calls, max_new_tokens)

    def ours() -> int:
        records = run_rollouts(spec, backend, formatter, case.seed)
        return sum(r.response_length for r in records)

    timings = interleave({"ours": ours, "bare": bare}, case.repeats)
    ours_tokens = {result for _, result in timings["ours"]}
    bare_tokens = {result for _, result in timings["bare"]}
    ours_rates = [tokens / seconds for seconds, tokens in timings["ours"]]
    bare_rates = [tokens / seconds for seconds, tokens in timings["bare"]]
    return {
        "shape": case.shape,
        "case": case.case,
        "batch": case.groups * case.group_size,
        "turns": len(recorder.calls),
        "max_new_tokens": max_new_tokens,
        "generated_tokens": sorted(ours_tokens),
        "same_tokens": ours_tokens == bare_tokens,
        "ours_seconds": [s for s, _ in timings["ours"]],
        "bare_seconds": [s for s, _ in timings["bare"]],
        "ours_tokens_per_s": spread(ours_rates),
        "bare_tokens_per_s": spread(bare_rates),
        "ratio": ratio_of_rates(ours_rates, bare_rates),
        "profile_ours": profile_top(ours, limit=10),
    }
