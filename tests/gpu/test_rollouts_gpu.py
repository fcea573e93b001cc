"""Hugging Face rollouts on the device: the log-prob stored with every sampled token is the one the trainer's
re-scoring of the stored ids gives, in fp32 to 1e-4 (as on the CPU, tests/rollout/test_engine.py) and in bf16 within
bf16's tolerance.

bf16 tolerance: generation scores each new token against the key/value cache one position at a time, re-scoring runs
the whole row at once; in bf16 the two orders of the same sums round differently (8 significant bits: each logit is
off by up to ~2**-8 of the largest logits' magnitude, a few units here), so a token's log-prob may differ by a few
hundredths. Allowed: 0.1 at any token and 0.02 on average, the tolerance the vLLM weight check uses in half
precision (docs/gpu.md); measured on the CPU stand-in: at most 0.002, 1e-4 on average. A stored log-prob of another
token or another temperature is off by about 1 or more.
"""

from __future__ import annotations

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.policy import load_policy
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.training import collate, token_logprobs

pytestmark = pytest.mark.gpu

TOLERANCE = {"fp32": (1e-4, 1e-4), "bf16": (0.1, 0.02)}  # (largest, mean) |stored - re-scored|
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stored_logprobs_equal_the_rescoring_on_the_device(device, tiny_model_dir, precision):
    model, tokenizer = load_policy(tiny_model_dir, dtype=DTYPES[precision])
    model = model.to(device.torch).eval()
    backend = HFBackend(model, tokenizer, temperature=1.0, max_new_tokens=24)
    spec = RolloutSpec("frozen_lake", [11, 12, 13, 14], 4, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=5)
    assert any(len(r.turns) > 1 for r in records), "the untrained model should need several turns somewhere"
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    with torch.no_grad():
        scored, _ = token_logprobs(model, batch.to(device.torch))
    scored = scored.float().cpu()
    differences = []
    for row, record in enumerate(records):
        mask = torch.tensor(record.loss_mask, dtype=torch.bool)
        stored = torch.tensor(record.behavior_logprobs)
        assert bool((stored[~mask] == 0).all())  # prompts and observations carry no log-prob
        assert bool((stored[mask] < 0).all())  # every sampled token has a real log-prob (nothing left unset)
        differences.append((scored[row, : len(record.input_ids)][mask] - stored[mask]).abs())
    difference = torch.cat(differences)
    largest, mean = TOLERANCE[precision]
    print(
        f"{precision} on {device.name}: {difference.numel()} sampled tokens, |stored - re-scored| at most "
        f"{float(difference.max()):.2e}, mean {float(difference.mean()):.2e}"
    )
    assert float(difference.max()) <= largest and float(difference.mean()) <= mean
