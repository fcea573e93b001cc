"""Statistics over the masked (response) tokens of a (B, T) tensor, and the critic's metrics built on them."""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (over everything, or along ``dim``); 0 where nothing is masked in."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim=dim) / mask.sum(dim=dim).clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected when ``unbiased`` and more than one entry, as veRL)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean).square(), mask)
    count = mask.to(values.dtype).sum()
    if unbiased and count > 1:
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """``(values - mean) / sqrt(var + epsilon)`` with mean and unbiased var over the masked entries (veRL's
    ``masked_whiten``); entries outside the mask are set to 0."""
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + epsilon)
    return whitened * mask.to(values.dtype)


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var(returns - values) / Var(returns)`` over the masked tokens: 1 for a perfect critic, 0 for one that
    predicts the mean, negative for one worse than that (veRL: ``critic/vf_explained_var``)."""
    return 1.0 - masked_var(returns - values, mask) / (masked_var(returns, mask) + 1e-5)


def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Critic health metrics over the masked tokens: value and return means, explained variance."""
    return {
        "critic/values_mean": float(masked_mean(values, mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
        "critic/vf_explained_var": float(explained_variance(returns, values, mask)),
    }
