"""Packed rows (the windowed context modes: one sequence per turn in a row) are scored as separate sequences: the
log-probs, entropies and gradients equal those of the packed forward with its block-diagonal attention, and those of
each sequence scored alone."""

import copy

import pytest
import torch

from ragen_core.training.batch import collate, model_inputs, token_logprobs, trained_columns, unpack


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows, masks, segments = [], [], []
    for lengths in ([7, 12, 5], [20], [9, 9], [3, 15, 6, 4]):
        ids = torch.randint(5, 500, (sum(lengths),), generator=gen).tolist()
        mask = [int(bit) for bit in (torch.rand(sum(lengths), generator=gen) < 0.5)]
        rows.append(ids), masks.append(mask), segments.append(lengths)
    return rows, masks, segments


def _packed_reference(model, batch):
    """The packed forward (position ids restarting per sequence; transformers builds the block-diagonal mask)."""
    logits = model(**model_inputs(batch)).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)


def test_unpack_splits_rows_at_the_position_restarts_and_keeps_the_mask():
    rows, masks, segments = _batch()
    batch = collate(rows, masks, 0, segments)
    flat, where = unpack(batch)
    assert len(flat) == 10 and flat.input_ids.shape[1] == 20
    expected = []
    for r, lengths in enumerate(segments):
        start = 0
        for n in lengths:
            expected.append((rows[r][start : start + n], [0] + masks[r][start + 1 : start + n]))
            start += n
    for f, (ids, mask) in enumerate(expected):
        n = len(ids)
        assert flat.input_ids[f, :n].tolist() == ids and flat.loss_mask[f, :n].tolist() == mask
        assert flat.attention_mask[f].tolist() == [1] * n + [0] * (20 - n)
    assert len(where[0]) == sum(map(len, rows))  # every packed token has exactly one flat place
    with pytest.raises(ValueError, match="packed batch"):
        unpack(collate(rows, masks, 0))


@pytest.mark.parametrize("use_columns", [False, True])
def test_scores_and_gradients_equal_the_packed_forward(tiny_policy, use_columns):
    model = copy.deepcopy(tiny_policy[0]).train()
    model.config.use_cache = False
    rows, masks, segments = _batch(1)
    batch = collate(rows, masks, 0, segments)
    columns = trained_columns(batch.loss_mask) if use_columns else None
    logp, entropy = token_logprobs(model, batch, with_entropy=True, columns=columns)
    (logp * batch.loss_mask).sum().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    reference = _packed_reference(model, batch)
    (reference * batch.loss_mask).sum().backward()
    mask = batch.loss_mask.bool()
    assert float((logp - reference)[mask].detach().abs().max()) < 1e-5
    assert bool((logp[batch.attention_mask == 0] == 0).all()) and entropy.shape == logp.shape
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(ours[name], p.grad, atol=1e-5, rtol=1e-4), name
    # and each sequence alone: the first sequence of row 0 scored on its own gives the same log-probs
    alone = collate([rows[0][:7]], [masks[0][:7]], 0)
    with torch.no_grad():
        single, _ = token_logprobs(model, alone)
    assert float((single[0, 1:7] - logp[0, 1:7].detach()).abs().max()) < 1e-5


def test_critic_values_equal_the_packed_forward_inside_each_sequence(tiny_policy):
    from ragen_core.training.batch import per_token_outputs
    from ragen_core.training.critic import ValueModel

    critic = ValueModel.from_policy(tiny_policy[0], head_seed=3)
    critic.backbone.config.use_cache = False
    rows, masks, segments = _batch(2)
    batch = collate(rows, masks, 0, segments)
    with torch.no_grad():
        ours = per_token_outputs(critic, batch)
        packed = critic(**model_inputs(batch))
    inside = batch.attention_mask.bool().clone()
    inside[batch.position_ids == 0] = False  # a sequence's first token: no value before it within its sequence
    assert ours.shape == packed.shape and float(packed[inside].abs().min()) > 0
    assert float((ours - packed)[inside].abs().max()) < 1e-5
