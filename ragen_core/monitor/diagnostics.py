"""Template-collapse diagnostics: the mutual information between a trajectory's input and its reasoning.

RAGEN-2 observes that token entropy cannot see *template collapse*: the reasoning stays diverse, yet no longer
depends on the input. It watches the mutual information I(X; Z) between the first-turn prompt X and the reasoning Z
instead. With the batch's distinct first-turn prompts as a uniform empirical distribution over X, the policy itself
gives p(z | x) for any pairing, so

    MI_hat = mean_i [ log p(z_i | x_i) - log mean_{j in S_i} p(z_i | x_j) ]

where trajectory i has prompt x_i and reasoning z_i, and S_i holds x_i plus up to M - 1 other distinct prompts of the
batch drawn at random (``M = trainer.mi_prompts``; the inner mean is a log-sum-exp). Reasoning copied from the input
gives log |S_i| (the bound), one template for every input gives 0. Cost: N x |S_i| teacher-forced sequences (N
trajectories), no generation.

RAGEN-2's headline (``collapse/mi_estimate``) is the per-token variant (log-probs divided by len(z) before the
log-sum-exp): ``diag/reasoning_mi_per_token`` here, which the template-collapse warning watches by default; its
``mi_seq_estimate`` (summed log-probs) is ``diag/reasoning_mi``. Its reasoning is the content of the ``<think>`` block
only (:func:`think_content`: the stripped text re-tokenised, as RAGEN-2), and replies without a closed block are
left out; the earlier span of this project
(the block through ``</think>``, else the whole reply: :func:`reasoning_tokens`) is ``trainer.mi_reasoning=block``.
Its multi-turn variant (:func:`sampled_turns`) scores (prompt, reasoning) pairs of every turn, drawn uniformly over
trajectories then over their turns, each draw its own prompt column.

The functions here are pure: they take token ids and a *scorer* (a callable returning log p(z | x) for a list of
(x, z) pairs), so the estimator can be checked against exact distributions; :func:`model_scorer` is the scorer of a
causal LM.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ragen_core.agent.spans import THINK_END, reasoning_tokens
from ragen_core.training.batch import collate, token_logprobs

TokenIds = tuple[int, ...]
Scorer = Callable[[Sequence[tuple[TokenIds, TokenIds]]], np.ndarray]  # (x, z) pairs -> summed log p(z | x)


def first_reply(input_ids: Sequence[int], loss_mask: Sequence[int]) -> tuple[TokenIds, TokenIds]:
    """(prompt, reply) of a trajectory's first turn: the tokens before the first policy token (system prompt, first
    user message and the assistant header) and the first run of policy tokens (``loss_mask`` 1)."""
    mask = np.asarray(loss_mask, dtype=bool)
    if not mask.any():
        return tuple(int(t) for t in input_ids), ()
    start = int(np.argmax(mask))
    gaps = np.flatnonzero(~mask[start:])
    end = start + int(gaps[0]) if len(gaps) else len(mask)
    return tuple(int(t) for t in input_ids[:start]), tuple(int(t) for t in input_ids[start:end])


THINK_START = "<think>"
SPECIAL_TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")  # RAGEN-2's list


def _cut_before(reply: TokenIds, decode: Callable[[list[int]], str], tag: str) -> int | None:
    """The number of leading tokens of ``reply`` whose text ends before the first ``tag`` (None: no ``tag``)."""
    text = decode(list(reply))
    if tag not in text:
        return None
    at = text.index(tag)
    cut = next(k for k in range(1, len(reply) + 1) if tag in decode(list(reply[:k])))  # the token completing it
    while cut > 0 and len(decode(list(reply[:cut]))) > at:  # back to the tokens wholly before the tag
        cut -= 1
    return cut


def think_content(
    reply: TokenIds,
    decode: Callable[[list[int]], str],
    think_in_prompt: bool,
    encode: Callable[[str], list[int]] | None = None,
) -> TokenIds:
    """RAGEN-2's reasoning of a reply: the text inside its first ``<think>...</think>`` (with ``think_in_prompt``,
    the prompt ends with ``<think>`` as ``rollout.think_prefix`` makes it, so the block opens at the reply's start),
    the special tags removed and stripped, re-tokenised by ``encode`` as RAGEN-2 does. Without ``encode``, the
    token-exact variant: the sampled tokens wholly inside the block, whitespace-only tokens at the ends dropped (a
    token that straddles a tag is left out). Empty (the reply is left out) without a closed block or with nothing
    but whitespace inside."""
    text = decode(list(reply))
    match = re.search(r"<think>(.*?)</think>", (THINK_START if think_in_prompt else "") + text, re.DOTALL)
    if match is None:
        return ()
    if encode is not None:
        content = match.group(1)
        for tag in SPECIAL_TAGS:
            content = content.replace(tag, "")
        return tuple(encode(content.strip()))
    start = 0
    if not think_in_prompt:
        start = next(k for k in range(1, len(reply) + 1) if THINK_START in decode(list(reply[:k])))
    end = _cut_before(reply[start:], decode, THINK_END)
    content_ids = list(reply[start : start + (end or 0)])
    while content_ids and not decode(content_ids[:1]).strip():
        content_ids.pop(0)
    while content_ids and not decode(content_ids[-1:]).strip():
        content_ids.pop()
    return tuple(content_ids)


def turn_replies(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[tuple[TokenIds, TokenIds]]:
    """(prompt, reply) of every turn of a full-context trajectory: each maximal run of policy tokens (``loss_mask``
    1) and all the tokens before it (the chat so far: what the policy was given when it wrote that reply)."""
    mask = np.asarray(loss_mask, dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    ids = [int(t) for t in input_ids]
    return [(tuple(ids[:a]), tuple(ids[a:b])) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def sampled_turns(
    turns: Sequence[Sequence[tuple[TokenIds, TokenIds]]], num_samples: int | None, seed: int
) -> list[tuple[TokenIds, TokenIds]]:
    """RAGEN-2's trajectory-uniform sample of (prompt, reasoning) pairs over every turn: ``turns[m]`` holds the pairs
    of trajectory m's turns that have a reasoning. Each of ``num_samples`` draws (None: as many as there are such
    turns) picks a trajectory uniformly, then one of its turns uniformly; a trajectory without any gives no pair
    for its draw (so fewer may come back). Drawn with replacement, seeded."""
    total = sum(len(t) for t in turns)
    draws = total if num_samples is None else min(num_samples, total)
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(draws):
        m = int(rng.integers(len(turns)))
        if turns[m]:
            pairs.append(turns[m][int(rng.integers(len(turns[m])))])
    return pairs


def reasoning_of(
    reply: TokenIds,
    decode: Callable[[list[int]], str] | None,
    span: str = "content",
    think_in_prompt: bool = True,
    encode: Callable[[str], list[int]] | None = None,
) -> TokenIds:
    """A reply's reasoning under ``trainer.mi_reasoning``: ``content`` (RAGEN-2's: :func:`think_content`, empty
    without a closed think block or when thinking is off, ``decode`` None) or ``block`` (:func:`reasoning_tokens`)."""
    if span == "block":
        return reasoning_tokens(reply, decode)
    if span != "content":
        raise ValueError(f"unknown reasoning span {span!r}; use 'content' or 'block'")
    return think_content(reply, decode, think_in_prompt, encode) if decode is not None else ()


def first_turn_reasoning(
    input_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    decode: Callable[[list[int]], str] | None,
    span: str = "block",
    think_in_prompt: bool = True,
    encode: Callable[[str], list[int]] | None = None,
) -> tuple[list[TokenIds], list[TokenIds]]:
    """(prompts, reasonings) of stored trajectories (their ``input_ids`` and ``loss_mask`` columns): each one's
    first-turn prompt and the reasoning of its first reply (:func:`first_reply`, :func:`reasoning_of`)."""
    prompts, reasonings = [], []
    for ids, mask in zip(input_ids, loss_masks, strict=True):
        prompt, reply = first_reply(ids, mask)
        prompts.append(prompt)
        reasonings.append(reasoning_of(reply, decode, span, think_in_prompt, encode))
    return prompts, reasonings


def every_turn_reasoning(
    input_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    decode: Callable[[list[int]], str] | None,
    span: str = "content",
    think_in_prompt: bool = True,
    encode: Callable[[str], list[int]] | None = None,
) -> list[list[tuple[TokenIds, TokenIds]]]:
    """Per trajectory, the (prompt, reasoning) pairs of its turns that have a reasoning (:func:`turn_replies`,
    :func:`reasoning_of`), as RAGEN-2 collects them for its multi-turn sample."""
    out = []
    for ids, mask in zip(input_ids, loss_masks, strict=True):
        replies = turn_replies(ids, mask)
        turns = [(x, reasoning_of(reply, decode, span, think_in_prompt, encode)) for x, reply in replies]
        out.append([(x, z) for x, z in turns if z])
    return out


@dataclass(frozen=True)
class MIEstimate:
    """The estimate and its parts (all means over the scored trajectories)."""

    mi: float  # mean_i [log p(z_i|x_i) - log mean_j p(z_i|x_j)], nats per reasoning
    mi_per_token: float  # the same with log-probs divided by len(z_i) (RAGEN-2's length-normalised variant)
    logp_own: float  # mean_i log p(z_i | x_i)
    logp_cross: float  # mean_i log mean_{j in S_i} p(z_i | x_j)
    retrieval: float  # share of i whose own prompt scores z_i highest (ties share the credit); chance = 1/|S_i|
    bound: float  # mean_i log |S_i|: the largest value ``mi`` can take
    trajectories: int  # N: trajectories scored
    prompts: int  # distinct prompts among them
    pairs: int  # (x, z) pairs asked for, N x |S_i| (before identical pairs are merged)
    scored: int  # distinct (x, z) sequences the scorer ran
    reasoning_tokens: float  # mean len(z_i)

    def metrics(self, prefix: str = "diag", stem: str = "reasoning") -> dict[str, float]:
        """The metrics-table rows of this estimate (``stem``: ``reasoning`` for the first turn, ``reasoning_mt``
        for the multi-turn sample)."""
        head = f"{prefix}/{stem}"
        return {
            f"{head}_mi": self.mi,
            f"{head}_mi_per_token": self.mi_per_token,
            f"{head}_mi_bound": self.bound,
            f"{head}_logp_own": self.logp_own,
            f"{head}_logp_cross": self.logp_cross,
            f"{head}_retrieval": self.retrieval,
            f"{head}_trajectories": float(self.trajectories),
            f"{head}_prompts": float(self.prompts),
            f"{head}_pairs": float(self.pairs),
            f"{head}_scored": float(self.scored),
            f"{head}_tokens": self.reasoning_tokens,
        }


def candidate_prompts(prompt_index: Sequence[int], num_prompts: int, max_prompts: int, seed: int) -> np.ndarray:
    """(N, m) prompt indices to score each trajectory under: column 0 its own prompt, then m - 1 distinct others
    drawn without replacement (seeded); m = min(max_prompts, num_prompts)."""
    if max_prompts < 2:
        raise ValueError(f"max_prompts must be >= 2 (own prompt + at least one other), got {max_prompts}")
    width = min(max_prompts, num_prompts)
    rng = np.random.default_rng(seed)
    rows = []
    for own in prompt_index:
        others = np.array([p for p in range(num_prompts) if p != own], dtype=np.int64)
        rows.append(np.concatenate([[own], rng.choice(others, size=width - 1, replace=False)]))
    return np.asarray(rows, dtype=np.int64).reshape(len(prompt_index), width)


def _retrieval(scores: np.ndarray) -> float:
    best = scores.max(axis=1, keepdims=True)
    ties = (scores == best).sum(axis=1)
    return float(np.mean(np.where(scores[:, 0] == best[:, 0], 1.0 / ties, 0.0)))


def estimate_from_scores(scores: np.ndarray, lengths: Sequence[int]) -> tuple[float, float, float, float, float]:
    """(mi, mi_per_token, logp_own, logp_cross, retrieval) from the (N, m) matrix of log p(z_i | x_{c(i, k)}) whose
    column 0 is each trajectory's own prompt; ``lengths`` = len(z_i)."""
    scores = np.asarray(scores, dtype=np.float64)
    width = scores.shape[1]
    cross = torch.logsumexp(torch.from_numpy(scores), dim=1).numpy() - math.log(width)
    per_token = scores / np.maximum(np.asarray(lengths, dtype=np.float64), 1.0)[:, None]
    cross_per_token = torch.logsumexp(torch.from_numpy(per_token), dim=1).numpy() - math.log(width)
    own = scores[:, 0]
    return (
        float(np.mean(own - cross)),
        float(np.mean(per_token[:, 0] - cross_per_token)),
        float(np.mean(own)),
        float(np.mean(cross)),
        _retrieval(scores),
    )


def reasoning_mi(
    prompts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    score: Scorer,
    max_prompts: int = 8,
    seed: int = 0,
    columns: Sequence[Hashable] | None = None,
) -> MIEstimate | None:
    """The MI estimate of trajectories i with first-turn prompt ``prompts[i]`` and reasoning ``reasonings[i]``
    (token ids), scored by ``score``. Trajectories with an empty reasoning are left out. Prompts are told apart by
    their tokens (group members share one), or by ``columns[i]`` when given (RAGEN-2's multi-turn sample: each draw
    its own column; a column's prompt is that of its first row). None when fewer than two distinct prompts remain:
    X is then constant and the MI is zero by definition, which says nothing about collapse."""
    keys = list(columns) if columns is not None else [tuple(map(int, x)) for x in prompts]
    kept = [k for k, z in enumerate(reasonings) if len(z)]
    rows = [(tuple(map(int, prompts[k])), tuple(map(int, reasonings[k]))) for k in kept]
    index: dict[Hashable, int] = {}
    distinct: list[TokenIds] = []
    for k, (x, _) in zip(kept, rows, strict=True):
        if keys[k] not in index:
            index[keys[k]] = len(distinct)
            distinct.append(x)
    if len(distinct) < 2:
        return None
    own = [index[keys[k]] for k in kept]
    candidates = candidate_prompts(own, len(distinct), max_prompts, seed)
    pairs = [(distinct[p], z) for (_, z), row in zip(rows, candidates, strict=True) for p in row]
    unique = list(dict.fromkeys(pairs))  # identical (x, z) pairs (a collapsed template) are scored once
    values = np.asarray(score(unique), dtype=np.float64)
    if values.shape != (len(unique),):
        raise ValueError(f"the scorer returned shape {values.shape} for {len(unique)} pairs")
    lookup = dict(zip(unique, values, strict=True))
    matrix = np.array([lookup[pair] for pair in pairs]).reshape(candidates.shape)
    lengths = [len(z) for _, z in rows]
    mi, mi_per_token, logp_own, logp_cross, retrieval = estimate_from_scores(matrix, lengths)
    return MIEstimate(
        mi=mi,
        mi_per_token=mi_per_token,
        logp_own=logp_own,
        logp_cross=logp_cross,
        retrieval=retrieval,
        bound=math.log(candidates.shape[1]),
        trajectories=len(rows),
        prompts=len(distinct),
        pairs=len(pairs),
        scored=len(unique),
        reasoning_tokens=float(np.mean(lengths)),
    )


def model_scorer(model: torch.nn.Module, pad_id: int, batch_size: int = 16) -> Scorer:
    """A scorer over a causal LM: log p(z | x) = the summed log-probs (temperature 1) of z's tokens after x, by
    teacher forcing, ``batch_size`` right-padded sequences per forward pass, without gradients."""

    @torch.no_grad()
    def score(pairs: Sequence[tuple[TokenIds, TokenIds]]) -> np.ndarray:
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        out = np.zeros(len(pairs), dtype=np.float64)
        order = sorted(range(len(pairs)), key=lambda k: len(pairs[k][0]) + len(pairs[k][1]))  # less padding
        try:
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                sequences = [list(pairs[k][0]) + list(pairs[k][1]) for k in chunk]
                masks = [[0] * len(pairs[k][0]) + [1] * len(pairs[k][1]) for k in chunk]
                batch = collate(sequences, masks, pad_id).to(device)
                logprobs, _ = token_logprobs(model, batch)
                sums = (logprobs.double() * batch.loss_mask.double()).sum(dim=1).cpu().numpy()
                out[chunk] = sums
        finally:
            model.train(was_training)
        return out

    return score
