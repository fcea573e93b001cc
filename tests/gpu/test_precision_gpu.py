"""bf16 on the device: the update of a bf16 engine (bf16 weights and activations, fp32 master weights) lands on the
fp32 engine's update from the same start, on the same batch, within what bf16 rounding allows.

The bound, per parameter tensor: ``||w_bf16 - w_fp32|| <= 2**-9 * ||w_fp32|| + EPSILON * ||w_fp32 - w_start||``.
The first term is storing the weights in bf16 at all (round to nearest with 8 significant bits: each element moves
by at most 2**-9 of itself); the second is the step computed from bf16 activations and gradients, a relative error
of the update itself. EPSILON = 0.15: bf16 forward/backward passes of this model put the step 2.5% (SGD) and 6.4%
(AdamW) off the fp32 step (measured on the CPU stand-in; H100 kernels accumulate matmuls in fp32 as well), and a
bf16 engine that stepped wrongly (no step, twice the step, another batch) is off by 100% or more on every tensor the
update moved, which the test checks is most of them.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ragen_core.algos import grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.update.advantages import trajectory_token_rewards
from tests.training.dp_update_script import ACTOR_CASES, MICRO_BATCH, fixed_batch

pytestmark = pytest.mark.gpu

ROUNDING = 2.0**-9  # bf16: 8 significant bits, round to nearest
EPSILON = 0.15  # the bf16 step's relative error allowed (see the module docstring)


def _update(model: torch.nn.Module, batch, advantages, precision: str, optimizer: str, lr: float, agg: str):
    """One StarPO update (2 PPO epochs, ZeRO-1: bf16 gradients accumulate in fp32) from ``model``; the weights on
    the CPU in fp32, and the metrics."""
    optim = OptimConfig(lr, 0.0, 1.0, MICRO_BATCH, zero_stage=1, optimizer=optimizer, precision=precision)
    actor = ActorEngine(copy.deepcopy(model), optim)
    algorithm = AlgorithmConfig(
        policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001, loss_agg_mode=agg
    )
    schedule = ActorConfig(mini_batch_size=8, ppo_epochs=2)
    metrics = actor.policy_update(batch, advantages, actor.score(batch), algorithm, schedule, 0)
    dtype = next(actor.module.parameters()).dtype
    weights = {name: p.detach().float().cpu() for name, p in actor.module.named_parameters()}
    return weights, metrics, dtype, actor.device


@pytest.mark.parametrize("case", [c for c in ACTOR_CASES if c[4] == 0.0], ids=lambda c: c[0])
def test_the_bf16_update_lands_on_the_fp32_update(device, tiny_policy, case):
    _, optimizer, lr, agg, _ = case
    model, tokenizer = tiny_policy
    batch, scores, groups = fixed_batch(tokenizer.pad_token_id)
    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    fp32, fp32_metrics, fp32_dtype, where = _update(model, batch, advantages, "fp32", optimizer, lr, agg)
    bf16, bf16_metrics, bf16_dtype, _ = _update(model, batch, advantages, device.half, optimizer, lr, agg)
    assert where.type == device.name and (fp32_dtype, bf16_dtype) == (torch.float32, torch.bfloat16)

    start = {name: p.detach().float() for name, p in model.named_parameters()}
    discriminating, worst = 0, 0.0
    for name, want in fp32.items():
        if optimizer == "adamw" and name.endswith("k_proj.bias"):
            # its true gradient is exactly 0 (softmax ignores a shift shared by all keys): AdamW divides float noise
            # by its own magnitude and steps it by ~lr in either precision, a step no precision can agree on
            continue
        step = (want - start[name]).norm()
        error = (bf16[name] - want).norm()
        bound = ROUNDING * want.norm() + EPSILON * step
        assert error <= bound, f"{name}: bf16 is {error:.3g} off the fp32 update (bound {bound:.3g}, step {step:.3g})"
        if step > 2 * ROUNDING * want.norm():  # a tensor whose step bf16 storage cannot hide
            discriminating += 1
            worst = max(worst, float((error - ROUNDING * want.norm()) / step))
    assert discriminating >= len(start) // 2, "the update moved too few tensors for the comparison to mean anything"
    print(
        f"{case[0]} on {device.name}: {discriminating}/{len(fp32)} tensors moved; the bf16 step's worst relative "
        f"error beyond storage rounding {worst:.3f} (allowed {EPSILON})"
    )
    # the gradient norm before clipping, from bf16 gradients: the same up to bf16 rounding of its terms
    assert bf16_metrics["actor/grad_norm"] == pytest.approx(fp32_metrics["actor/grad_norm"], rel=0.05)
