"""Policy and value losses, KL estimators, entropy and loss aggregation: small pure tensor functions.

Policy losses share one signature, ``fn(logprobs, old_logprobs, advantages, mask, clip_low, clip_high,
loss_agg_mode, token_count) -> (loss, stats)``, and are registered by name in ``POLICY_LOSSES`` with the options they
read from the ``algorithm`` config section (:meth:`~ragen_core.registry.Registry.call` passes them by field name).
"""

from __future__ import annotations

import torch

from ragen_core.algos.masked import masked_mean
from ragen_core.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
PPO_OPTIONS = ("clip_low", "clip_high", "loss_agg_mode")  # the algorithm fields the clipped losses read


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, token_count: float | None = None
) -> torch.Tensor:
    """Reduce a (B, T) loss matrix over the masked tokens.

    ``token-mean``: sum over all masked tokens / number of masked tokens (``token_count`` overrides the
    denominator, so micro-batches of one mini-batch add up to the mini-batch's token mean).
    ``seq-mean-token-mean``: mean over tokens within each sequence, then mean over sequences (the paper's equation).
    ``seq-mean-token-sum``: sum over tokens within each sequence, then mean over sequences (Dr. GRPO style).
    The sequence means count only sequences with at least one masked token (as veRL does): a row with nothing to
    train does not dilute the others.
    """
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        denominator = mask.sum() if token_count is None else torch.as_tensor(token_count, dtype=loss_mat.dtype)
        return (loss_mat * mask).sum() / denominator.clamp(min=1.0)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; use one of {', '.join(LOSS_AGG_MODES)}")
    per_sequence = (loss_mat * mask).sum(dim=-1)  # (B,)
    if mode == "seq-mean-token-mean":
        per_sequence = per_sequence / mask.sum(dim=-1).clamp(min=1.0)
    return per_sequence.sum() / (mask.sum(dim=-1) > 0).sum().clamp(min=1).to(loss_mat.dtype)


def trained_sequences(mask: torch.Tensor) -> int:
    """Rows of a (B, T) mask with at least one masked token: the denominator of the sequence-mean modes."""
    return int((mask.sum(dim=-1) > 0).sum())


@register_policy_loss("ppo", options=PPO_OPTIONS)
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    token_count: float | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with decoupled clip range ``[1 - clip_low,
    1 + clip_high]`` (DAPO / StarPO-S): per token ``max(-A r, -A clip(r))``.

    With ``clip_ratio_c`` (dual-clip PPO, Ye et al. 2020, eq. 5), tokens with ``A < 0`` are further bounded by
    ``-A c``: ``min(max(-A r, -A clip(r)), -A c)``, so a huge ratio on a bad action cannot blow up the loss.

    Returns the aggregated loss and detached statistics: clip fractions above and below, the dual-clip fraction,
    and the approximate KL to the behaviour (old) policy.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be greater than 1.0 (dual-clip lower bound; veRL: 3.0)")
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0)  # (B, T); clamp as veRL, avoids inf
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_losses = torch.maximum(pg_loss1, pg_loss2)  # (B, T)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if clip_ratio_c is not None:
        pg_loss3 = -advantages * clip_ratio_c
        dual_clipped = (advantages < 0) & (pg_losses > pg_loss3)
        pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses, pg_loss3), pg_losses)
    loss = aggregate_loss(pg_losses, mask, loss_agg_mode, token_count)
    with torch.no_grad():
        stats = {
            "clipfrac_upper": masked_mean(((ratio > 1.0 + clip_high) & (advantages > 0)).to(ratio.dtype), mask),
            "clipfrac_lower": masked_mean(((ratio < 1.0 - clip_low) & (advantages < 0)).to(ratio.dtype), mask),
            "clipfrac_dual": masked_mean(dual_clipped.to(ratio.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, stats


@register_policy_loss("dual_clip", options=(*PPO_OPTIONS, "clip_ratio_c"))
def dual_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    token_count: float | None = None,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dual-clip PPO: :func:`ppo_clip_loss` with the ``-A c`` bound for negative advantages on (veRL's
    ``compute_policy_loss``, ``clip_ratio_c`` 3.0 by default)."""
    return ppo_clip_loss(
        logprobs, old_logprobs, advantages, mask, clip_low, clip_high, loss_agg_mode, token_count, clip_ratio_c
    )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    token_count: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO2 / veRL ``compute_value_loss``): with ``V_clip = old + clip(V - old, -eps, eps)``,
    per token ``max((V - G)^2, (V_clip - G)^2)``, aggregated, times 1/2.

    Stats: ``vf_clipfrac`` (share of masked tokens the clip acts on: ``|V - old| > eps`` and the clipped term is the
    larger) and ``vpred_mean``. Inside the range ``old + (V - old)`` can round one ulp away from ``V``, which makes
    the clipped term "larger" by rounding alone; veRL counts those tokens, we do not.
    """
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)  # (B, T)
    vf_losses1 = (values - returns).square()
    vf_losses2 = (values_clipped - returns).square()
    loss = 0.5 * aggregate_loss(torch.maximum(vf_losses1, vf_losses2), mask, loss_agg_mode, token_count)
    with torch.no_grad():
        stats = {
            "vf_clipfrac": masked_mean(
                (((values - old_values).abs() > cliprange_value) & (vf_losses2 > vf_losses1)).to(values.dtype), mask
            ),
            "vpred_mean": masked_mean(values, mask),
        }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimates of KL(pi || ref) from samples of pi (Schulman, "Approximating KL divergence", 2020).

    With ``log r = log pi - log ref``: ``k1`` / ``kl``: ``log r``; ``abs``: ``|log r|``; ``k2`` / ``mse``:
    ``(log r)^2 / 2``; ``k3`` / ``low_var_kl``: ``1/r - 1 + log r`` (unbiased, >= 0), clamped to [-10, 10] as veRL.
    """
    log_ratio = logprobs - ref_logprobs
    if kind in ("k1", "kl"):
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("k2", "mse"):
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        neg = torch.clamp(-log_ratio, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; use one of {', '.join(KL_ESTIMATORS)}")


def apply_kl_penalty(
    token_rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward (veRL ``apply_kl_penalty``, InstructGPT eq. 2): ``r_t - beta * KL_t`` on masked tokens.

    Returns the new token rewards (B, T) and the mean KL: per-sequence token mean, then mean over sequences.
    """
    kl = kl_penalty(logprobs, ref_logprobs, kind) * mask  # (B, T)
    new_rewards = token_rewards - kl_coef * kl
    mean_kl = masked_mean(kl, mask, dim=-1).mean()
    return new_rewards, mean_kl


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Token entropy of the categorical distribution given by ``logits`` (..., V) -> (...)."""
    return entropy_from_logprobs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_v p log p`` of distributions given as log-probabilities (..., V) -> (...)."""
    return -(logp.exp() * logp).sum(dim=-1)
