"""The update's cost (``perf/*``): the model FLOPs of a Qwen2-shaped model counted by hand and, independently, by
torch's own FLOP counter over a real forward and backward; the passes an update tallies; and the metrics a real
update returns (time, TFLOP/s, MFU against the measured peak, tokens per second, peak memory)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen_core.training import ActorEngine, OptimConfig, collate, token_logprobs
from ragen_core.training.batch import trained_columns
from ragen_core.training.cost import (
    ModelShape,
    PassTally,
    UpdateClock,
    critic_passes,
    matmul_peak_tflops,
    sequence_squares,
)
from ragen_core.update.rows import TokenBatch

# hidden 64 = 4 heads x 16, 2 key/value heads, MLP 128, vocabulary 100, 2 layers
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=64,
)
# per layer, by hand: q 64x64, k 64x32, v 64x32, o 64x64, gate 64x128, up 64x128, down 128x64
LAYER = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 64 * 128 + 64 * 128 + 128 * 64
assert LAYER == 36864


def _model(attention: str = "eager") -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**SHAPE, attn_implementation=attention)).eval()


def test_the_shape_of_a_qwen2_model_by_hand():
    assert ModelShape.of(_model()) == ModelShape(
        linear_weights=2 * LAYER, head_weights=100 * 64, layers=2, attention_width=64
    )


def test_forward_flops_by_hand_with_padding_packing_and_trained_columns():
    shape = ModelShape.of(_model())
    # rows of 5 and 3 tokens (padded to 5): 8 tokens, sequences 5^2 + 3^2 = 34
    batch = collate([[1, 2, 3, 4, 5], [6, 7, 8]], [[0, 0, 1, 1, 1], [0, 1, 1]], pad_id=0)
    linear, attention, head = 2 * 73728 * 8, 4 * 2 * 64 * 34, 2 * 6400 * 8
    assert shape.forward_flops(batch) == linear + attention + head == 1299456
    # the head at columns 2, 3, 4 only: row 0 holds 3 of them, row 1 (3 tokens) only column 2
    assert shape.forward_flops(batch, torch.tensor([2, 3, 4])) == linear + attention + 2 * 6400 * 4
    # a packed row of sequences of 3 and 2 tokens: 3^2 + 2^2 attention, not 5^2
    packed = collate([[1, 2, 3, 4, 5]], [[0, 1, 1, 0, 1]], pad_id=0, segment_lengths=[[3, 2]])
    assert sequence_squares(packed) == 13.0


@pytest.mark.parametrize("with_columns", [False, True])
def test_forward_and_backward_flops_agree_with_torch_s_flop_counter(with_columns):
    """torch counts the matmuls of the real passes (eager attention: its two batched matmuls per layer; the head at
    ``logits_to_keep`` positions only): rows of equal length, so every projected position holds a token."""
    model = _model("eager").train()
    ids = torch.randint(1, 100, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(3, 12)
    mask[:, 7:] = 1.0
    batch = TokenBatch(ids, torch.ones_like(ids), mask)
    columns = trained_columns(batch.loss_mask) if with_columns else None
    counter = FlopCounterMode(display=False)
    with counter:
        logprobs, _ = token_logprobs(model, batch, columns=columns)
        forward = counter.get_total_flops()
        (logprobs * batch.loss_mask).sum().backward()
    expected = ModelShape.of(model).forward_flops(batch, columns)
    assert forward == expected
    assert counter.get_total_flops() == 3 * expected  # a backward pass costs twice its forward


def test_an_update_tallies_its_passes_and_reports_its_cost(tiny_policy):
    model, tokenizer = tiny_policy
    actor = ActorEngine(
        copy.deepcopy(model), OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=2)
    )
    batch = collate(
        [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8], [5, 6, 7]],
        [[0, 0, 0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1]],
        tokenizer.pad_token_id,
    )
    with UpdateClock([actor, None], actor.device, torch.float32) as clock:
        actor.score(batch)
        actor.sft_update(batch, batch_size=3, shuffle_seed=0)
    metrics = clock.metrics()
    # by the tally's own parts: one scoring pass (forward, every column) and one training pass (forward and
    # backward, the head at the trained columns), micro-batches of 2 rows each cut to their own width
    expected = PassTally(actor.tally.shape)
    for rows in ([0, 1], [2]):
        expected.add(batch.select(rows))
    for rows in _sft_micro_rows(batch):
        host = batch.select(rows)
        expected.add(host, trained_columns(host.loss_mask), backward=True)
    assert metrics["perf/model_tflop"] == pytest.approx(expected.flops / 1e12, rel=1e-12)
    assert metrics["perf/tokens_per_s"] == pytest.approx(2 * 13 / metrics["perf/update_s"])
    assert metrics["perf/tflops"] == pytest.approx(metrics["perf/model_tflop"] / metrics["perf/update_s"])
    assert 0.0 < metrics["perf/mfu"] < 1.0 and metrics["perf/peak_rss_gb"] > 0.05
    assert "perf/peak_cuda_gb" not in metrics  # a CPU run


def _sft_micro_rows(batch: TokenBatch) -> list[list[int]]:
    """The micro-batches of the SFT epoch above: its shuffled order (seed 0) cut into micro-batches of 2."""
    import numpy as np

    order = np.random.default_rng(0).permutation(len(batch)).tolist()
    return [order[:2], order[2:]]


def test_the_measured_peak_leaves_the_random_state_alone():
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    assert matmul_peak_tflops("cpu", size=64, repeats=1, seconds=0.01) > 0
    assert torch.equal(torch.rand(1), before)


def test_a_value_model_counts_its_head_per_token_and_the_critic_its_passes():
    """The critic's value model: the backbone's linear layers and the scalar head (64 x 1) per token, no output
    head; torch's counter agrees on a forward and backward, and :func:`critic_passes` counts one forward for the
    values and a forward and backward per epoch."""
    from ragen_core.training.batch import per_token_outputs
    from ragen_core.training.critic import ValueModel

    value = ValueModel.from_policy(_model("eager")).train()
    shape = ModelShape.of(value)
    assert shape == ModelShape(linear_weights=2 * LAYER + 64, head_weights=0, layers=2, attention_width=64)
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(2))
    batch = TokenBatch(ids, torch.ones_like(ids), torch.ones(2, 9))
    counter = FlopCounterMode(display=False)
    with counter:
        per_token_outputs(value, batch).sum().backward()
    assert counter.get_total_flops() == 3 * shape.forward_flops(batch)
    passes = critic_passes(value, batch, epochs=2)
    assert passes.flops == shape.forward_flops(batch) * 7 and passes.tokens == 18 * 3
