"""algorithm.kl_span=think: the KL anchor covers each reply's thinking only (ragen_core.agent.spans.think_mask)."""

import copy

import pytest
import torch

from ragen_core.agent.spans import think_mask
from ragen_core.config import ActorConfig, AlgorithmConfig
from ragen_core.training import ActorEngine, OptimConfig, collate

PROMPT = "<|im_start|>user\nChoose.<|im_end|>\n<|im_start|>assistant\n<think>"
REPLIES = [
    "I will take Phoenix.</think><answer>Dragon</answer><|im_end|>",
    "The goal is down.</think><answer>Down</answer><|im_end|>",
    "I will take Phoenix. I will take",  # cut before its tag: all of it is thinking
]


def _rows(tokenizer):
    """Two rows: one turn, and two turns (two replies in one row), with each reply's token span."""
    ids, masks, spans = [], [], []
    for replies in ([REPLIES[0]], [REPLIES[1], REPLIES[2]]):
        row, mask, row_spans = [], [], []
        for reply in replies:
            prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
            answer = tokenizer.encode(reply, add_special_tokens=False)
            row += prompt
            mask += [0] * len(prompt)
            row_spans.append((len(row), len(row) + len(answer)))
            row += answer
            mask += [1] * len(answer)
        ids.append(row), masks.append(mask), spans.append(row_spans)
    return ids, masks, spans


def _linear_cut(tokenizer, reply):
    """The thinking's length by a linear scan: the shortest prefix whose text holds the tag, else the whole reply."""
    for k in range(1, len(reply) + 1):
        if "</think>" in tokenizer.decode(reply[:k]):
            return k
    return len(reply)


def test_the_mask_covers_each_replys_thinking_and_nothing_else(tiny_policy):
    _, tokenizer = tiny_policy
    ids, masks, spans = _rows(tokenizer)
    mask = think_mask(ids, masks, tokenizer.decode)
    assert mask.shape == (2, max(len(r) for r in ids))
    for row, row_spans in enumerate(spans):
        expected = [0.0] * mask.shape[1]
        for start, end in row_spans:
            cut = _linear_cut(tokenizer, ids[row][start:end])
            expected[start : start + cut] = [1.0] * cut
            thinking = tokenizer.decode(ids[row][start : start + cut])
            rest = tokenizer.decode(ids[row][start + cut : end])
            assert "</think>" not in rest and ("</think>" in thinking or cut == end - start)
        assert mask[row].tolist() == expected
    assert mask[0].sum() < sum(masks[0])  # the answer of a closed reply is left out


@pytest.fixture(scope="module")
def batch(tiny_policy):
    _, tokenizer = tiny_policy
    ids, masks, _ = _rows(tokenizer)
    return collate(ids, masks, tokenizer.pad_token_id), torch.from_numpy(think_mask(ids, masks, tokenizer.decode))


def _kl_update(tiny_policy, batch, kl_mask):
    model, _ = tiny_policy
    optim = OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1)
    actor = ActorEngine(copy.deepcopy(model), optim)
    algorithm = AlgorithmConfig(
        policy_loss="ppo", kl_coef=0.1, kl_estimator="k1", entropy_coef=0.0, loss_agg_mode="token-mean"
    )
    old = actor.score(batch)
    reference = old - 0.5  # k1 = logp - ref = 0.5 on every token before the step
    zero = torch.zeros_like(batch.loss_mask)  # no policy-gradient term: the KL alone moves the weights
    before = [p.detach().clone() for p in actor.engine.module.parameters()]
    metrics = actor.policy_update(
        batch, zero, old, algorithm, ActorConfig(mini_batch_size=2), 0, reference, kl_mask=kl_mask
    )
    moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, actor.engine.module.parameters(), strict=True))
    return metrics, moved


def test_the_kl_term_counts_the_masked_tokens_only(tiny_policy, batch):
    tokens, kl_mask = batch
    trained = float(tokens.loss_mask.sum())
    full, _ = _kl_update(tiny_policy, tokens, None)
    assert full["actor/kl_loss"] == pytest.approx(0.5, rel=1e-5)
    think, moved = _kl_update(tiny_policy, tokens, kl_mask)
    assert think["actor/kl_loss"] == pytest.approx(0.5 * float(kl_mask.sum()) / trained, rel=1e-5)
    assert moved
    nothing, moved = _kl_update(tiny_policy, tokens, torch.zeros_like(kl_mask))
    assert nothing["actor/kl_loss"] == 0.0 and not moved  # no token in the span: the weights do not move
