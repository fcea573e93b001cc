"""Policy losses, KL estimators, entropy and loss aggregation: small pure tensor functions."""

from __future__ import annotations

import torch

from ragen_core.algos.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, token_count: float | None = None
) -> torch.Tensor:
    """Reduce a (B, T) loss matrix over the masked tokens.

    ``token-mean``: sum over all masked tokens / number of masked tokens (``token_count`` overrides the
    denominator, so micro-batches of one mini-batch add up to the mini-batch's token mean).
    ``seq-mean-token-mean``: mean over tokens within each sequence, then mean over sequences (the paper's equation).
    """
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        denominator = mask.sum() if token_count is None else torch.as_tensor(token_count, dtype=loss_mat.dtype)
        return (loss_mat * mask).sum() / denominator.clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        per_sequence = (loss_mat * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
        return per_sequence.mean()
    raise ValueError(f"unknown loss_agg_mode {mode!r}; use 'token-mean' or 'seq-mean-token-mean'")


@register_policy_loss("ppo")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    token_count: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with decoupled clip range ``[1 - clip_low, 1 + clip_high]`` (DAPO / StarPO-S).

    Returns the aggregated loss and detached statistics: clip fractions above and below, approximate KL to the
    behaviour (old) policy.
    """
    log_ratio = logprobs - old_logprobs  # (B, T)
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_losses = torch.maximum(pg_loss1, pg_loss2)
    loss = aggregate_loss(pg_losses, mask, loss_agg_mode, token_count)
    with torch.no_grad():
        mask_f = mask.to(ratio.dtype)
        count = mask_f.sum().clamp(min=1.0)
        stats = {
            "clipfrac_upper": (((ratio > 1.0 + clip_high) & (advantages > 0)).to(ratio.dtype) * mask_f).sum() / count,
            "clipfrac_lower": (((ratio < 1.0 - clip_low) & (advantages < 0)).to(ratio.dtype) * mask_f).sum() / count,
            "ppo_kl": ((-log_ratio) * mask_f).sum() / count,
        }
    return loss, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(pi || ref) estimates (Schulman's k1, k2 / mse, k3 / low-var)."""
    log_ratio = logprobs - ref_logprobs
    if kind in ("k1", "kl"):
        return log_ratio
    if kind in ("k2", "mse"):
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        neg = -log_ratio
        return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2 (mse) or k3 (low_var_kl)")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Token entropy of the categorical distribution given by ``logits`` (..., V) -> (...)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
