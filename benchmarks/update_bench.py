"""Update efficiency: trained tokens per second of our update stage divided by a bare torch loop.

Ours is the update stage's core call, :func:`ragen_core.run.stages.update_policy` (read the published kept rows,
collate, old log-probs, advantages, DeepSpeed PPO steps), on a real batch that our rollout, persist, validate and
filter stages wrote (configs/bandit.yaml: 8 x 16 rollouts, 25% of the groups kept, mini- and micro-batches of 16).
The batch is on-policy, so ours takes the stored behaviour log-probs as the old ones
(``actor.reuse_behavior_logprobs=auto``); a third side, "rescore", is the same call re-scoring them (``never``, how
the update ran before), interleaved with the other two.

Bare is the least a PPO/GRPO update of the same batch must do, in plain torch: a copy of the same model, the same
token tensors (padded once, outside the timing), the same mini-batches, and per mini-batch one forward, the
clipped surrogate (token-mean) against the sampler's stored log-probs, one backward, gradient clipping and a
``torch.optim.AdamW`` step. No DeepSpeed, no framework. Trained tokens are the loss-masked tokens (the same on
both sides). Bare projects every position onto the vocabulary; ours projects only the columns that hold trained
tokens (``logits_to_keep``), so a fourth side, "bare_kept", is bare doing the same (the ratio against it is the
framework's own cost).
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import ROOT, StopWatch, interleave, profile_top, ratio_of_rates, spread
from benchmarks.models import parameter_count
from ragen_core.config import RunConfig
from ragen_core.run import stages
from ragen_core.run.checks import build_run_config, load_run_config
from ragen_core.run.iteration import IterationState
from ragen_core.run.session import RunSession, open_session
from ragen_core.seeding import derive_seed
from ragen_core.storage import DataLake
from ragen_core.training import updater as updater_module
from ragen_core.training.actor import GAP_METRIC


@dataclass(frozen=True)
class UpdateCase:
    """One side-by-side measurement: a model folder, the threads and the repeats."""

    shape: str
    model_dir: Path
    repeats: int
    threads: int
    device: str = "cpu"


def bench_config(case: UpdateCase) -> RunConfig:
    """configs/bandit.yaml on the case's model, without the bootstrap; bf16 engines on a GPU."""
    overrides = [f"model.path={case.model_dir}", "bootstrap.enabled=false", f"trainer.num_threads={case.threads}"]
    if case.device == "cuda":
        overrides.append("trainer.precision=bf16")
    return load_run_config(ROOT / "configs" / "bandit.yaml", overrides)


def policy_of(session: RunSession) -> torch.nn.Module:
    """The policy module the session trains (in-process: the rollouts sample from the actor's own module)."""
    return session.policy.model


def make_batch(session: RunSession, iteration: int) -> None:
    """Generate, persist, validate and filter (publish) one real training batch, as the flow's stages do."""
    state = IterationState()
    for stage in (stages.generate_rollouts, stages.persist, stages.validate, stages.filter_and_publish):
        stage(session, iteration, state)


class BareUpdate:
    """A plain torch PPO/GRPO update on the same kept rows: the denominator of the update ratio."""

    def __init__(self, session: RunSession, iteration: int, kept_columns: bool = False) -> None:
        config = session.config
        self.kept_columns = kept_columns  # project only the columns with trained tokens, as ours does
        self.model = copy.deepcopy(policy_of(session))
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.actor.lr, weight_decay=config.actor.weight_decay
        )
        self.clip_low, self.clip_high = config.algorithm.clip_low, config.algorithm.clip_high
        self.grad_clip = config.actor.grad_clip
        rows = session.lake.read_table("trajectories", session.run_id, iteration)
        rows = rows.filter(rows["kept"]).sort_by([("group_id", "ascending"), ("traj_index", "ascending")])
        device = next(self.model.parameters()).device
        ids, mask, old = rows["input_ids"].to_pylist(), rows["loss_mask"].to_pylist(), rows["behavior_logprobs"]
        width = max(len(x) for x in ids)
        pad = session.tokenizer.pad_token_id
        self.input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device)
        self.attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
        self.loss_mask = torch.tensor([x + [0] * (width - len(x)) for x in mask], device=device, dtype=torch.float32)
        self.loss_mask[:, 0] = 0.0
        self.old = torch.tensor([x + [0.0] * (width - len(x)) for x in old.to_pylist()], device=device)
        scores = torch.tensor(rows["total_reward"].to_numpy(), dtype=torch.float32)
        groups = rows["group_id"].to_numpy()
        advantage = torch.zeros_like(scores)  # GRPO: score standardised within its group
        for group in np.unique(groups):
            members = torch.as_tensor(groups == group)
            group_scores = scores[members]
            advantage[members] = (group_scores - group_scores.mean()) / (group_scores.std() + 1e-6)
        self.advantages = advantage.to(device)[:, None] * self.loss_mask
        order = np.random.default_rng(derive_seed(config.seed, iteration, "update_shuffle")).permutation(len(ids))
        size = config.actor.mini_batch_size
        self.steps = [order[i : i + size].tolist() for i in range(0, len(order), size)]
        self.trained_tokens = int(self.loss_mask.sum())

    def __call__(self) -> int:
        for rows in self.steps:
            width = int(self.attention[rows].sum(1).max())
            ids, attention = self.input_ids[rows, :width], self.attention[rows, :width]
            mask, old, adv = self.loss_mask[rows, 1:width], self.old[rows, 1:width], self.advantages[rows, 1:width]
            if self.kept_columns:
                keep = torch.nonzero(mask.sum(0) > 0).squeeze(-1)  # position t + 1 is predicted at t
                mask, old, adv, targets = mask[:, keep], old[:, keep], adv[:, keep], ids[:, 1:][:, keep]
                logits = self.model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits.float()
            else:
                targets = ids[:, 1:]
                logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
            logprobs = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
            ratio = torch.exp(logprobs - old)
            surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - self.clip_low, 1 + self.clip_high) * adv)
            loss = -(surrogate * mask).sum() / mask.sum().clamp(min=1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return self.trained_tokens


def rescoring_update(session: RunSession, iteration: int) -> Callable[[], int]:
    """Our update with ``actor.reuse_behavior_logprobs=never`` (the old log-probs re-scored by a forward pass)."""
    updater = session.updater
    never = build_run_config(updater.config.to_dict(), ["actor.reuse_behavior_logprobs=never"])

    def run() -> int:
        own = updater.config
        updater.config = never
        try:
            return int(stages.update_policy(session, iteration, IterationState())["actor/trained_tokens"])
        finally:
            updater.config = own

    return run


def _breakdown_watch(session: RunSession) -> tuple[StopWatch, list[tuple[Any, str, Any]]]:
    """Wrap the update's parts (read + collate, re-scoring, PPO steps) in a stop watch; returns the patches."""
    watch = StopWatch()
    actor_type = type(session.updater.actor)
    patches = [(updater_module, "update_inputs", updater_module.update_inputs)]
    patches += [(actor_type, name, getattr(actor_type, name)) for name in ("score", "policy_update")]
    for target, name, original in patches:
        setattr(target, name, watch.wrap(name, original))
    return watch, patches


def _time_sides(session: RunSession, bare: BareUpdate, kept: BareUpdate, repeats: int) -> dict[str, Any]:
    """Warm-ups, the interleaved repeats of ours, bare, rescore and bare_kept, then one more update of ours alone
    (its time breakdown: the interleave also times the rescore side) and a profile of ours."""
    watch, patches = _breakdown_watch(session)
    try:

        def ours() -> int:
            return int(stages.update_policy(session, 0, IterationState())["actor/trained_tokens"])

        rescore = rescoring_update(session, 0)
        # warm-up of every side (first-step allocations, optimizer state); ours first, while the batch is still
        # on-policy (later repeats update on it again): its log-prob gap is the meaningful one
        gap = stages.update_policy(session, 0, IterationState()).get(GAP_METRIC)
        bare()
        rescore()
        kept()
        timings = interleave({"ours": ours, "bare": bare, "rescore": rescore, "bare_kept": kept}, repeats)
        watch.take()
        started = time.perf_counter()
        ours()
        alone, parts = time.perf_counter() - started, watch.take()
        profile = profile_top(ours, limit=12)
    finally:
        for target, name, original in patches:
            setattr(target, name, original)
    shares = {name: seconds / alone for name, seconds in parts.items()}
    return {"timings": timings, "gap": gap, "parts": shares, "profile": profile}


def measure(case: UpdateCase) -> dict[str, Any]:
    """Interleaved repeats of ours, bare, rescore and bare_kept on one real batch; rates, ratios, our time breakdown
    and a profile."""
    config = bench_config(case)
    with tempfile.TemporaryDirectory(prefix="update-bench-") as root:
        lake = DataLake(root)
        session = open_session(config, lake, f"update-bench-{case.shape}", case.model_dir)
        try:
            make_batch(session, 0)
            bare, kept = BareUpdate(session, 0), BareUpdate(session, 0, kept_columns=True)
            parameters = parameter_count(bare.model)
            sides = _time_sides(session, bare, kept, case.repeats)
        finally:
            session.close() if hasattr(session, "close") else None
    timings = sides["timings"]
    tokens = bare.trained_tokens
    ours_rates = [tokens / seconds for seconds, _ in timings["ours"]]
    bare_rates = [tokens / seconds for seconds, _ in timings["bare"]]
    rescore_rates = [tokens / seconds for seconds, _ in timings["rescore"]]
    padded = int(bare.attention.sum())
    return {
        "shape": case.shape,
        "parameters": parameters,
        "rows": len(bare.input_ids),
        "optimizer_steps": len(bare.steps),
        "trained_tokens": tokens,
        "processed_tokens": padded,
        "same_tokens": all(result == tokens for _, result in timings["ours"]),
        "ours_seconds": [s for s, _ in timings["ours"]],
        "bare_seconds": [s for s, _ in timings["bare"]],
        "ours_tokens_per_s": spread(ours_rates),
        "bare_tokens_per_s": spread(bare_rates),
        "ratio": ratio_of_rates(ours_rates, bare_rates),
        "rescore_seconds": [s for s, _ in timings["rescore"]],
        "rescore_tokens_per_s": spread(rescore_rates),
        "rescore_ratio": ratio_of_rates(rescore_rates, bare_rates),
        "reuse_speedup": ratio_of_rates(ours_rates, rescore_rates),
        "bare_kept_seconds": [s for s, _ in timings["bare_kept"]],
        "ratio_vs_bare_kept": ratio_of_rates(ours_rates, [tokens / seconds for seconds, _ in timings["bare_kept"]]),
        "behavior_logprob_gap": sides["gap"],
        "ours_breakdown_share": sides["parts"],
        "profile_ours": sides["profile"],
    }
