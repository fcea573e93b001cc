"""The off-policy correction (``algorithm.off_policy_correction``): per-token importance weights of the proximal
policy over the behaviour policy, for batches sampled by an older policy than the one the update starts from.

Three policies meet in one update: the behaviour policy ``mu`` that sampled the batch (the sampler's stored
log-probs), the proximal policy ``pi_prox`` the update starts from (the batch re-scored by the actor), and the policy
``pi_theta`` being trained. PPO clips ``r = pi_theta / pi_prox``, and each token's loss is weighted by
``w = pi_prox / mu``, which makes the expectation over ``mu``'s samples one over ``pi_prox``'s:

- ``decoupled`` (decoupled PPO, AReaL, arXiv 2505.24298): ``w`` as is; with a cap, tokens whose ``w`` exceeds it
  get weight 0 (left out of the gradient, still counted in the loss's denominators, as AReaL does);
- ``tis`` (truncated importance sampling: Yao et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training", as veRL implements it): ``min(w, cap)``, the cap 2.0 unless set.

The weights are detached and non-negative, so weighting the loss is scaling the advantages: for ``w >= 0``,
``w * max(-A r, -A clip(r)) = max(-(w A) r, -(w A) clip(r))``, and the dual-clip bound ``min(., -A c)`` for
``A < 0`` scales the same way (``w A`` has ``A``'s sign, or is 0 where the token contributes nothing either way).
The update therefore passes ``w * A`` to the unchanged policy loss; the aggregation's denominators still count every
masked token. The entropy bonus and a KL loss term are not weighted.
"""

from __future__ import annotations

import torch

from ragen_core.algos.masked import masked_mean

OFF_POLICY_CORRECTIONS = ("none", "decoupled", "tis")
TIS_DEFAULT_CAP = 2.0  # tis's truncation when algorithm.is_cap is unset


def behaviour_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The (B, T) importance weight of each token (detached float32, 0 off ``mask``) and its statistics.

    ``w_raw = exp(proximal - behaviour)``, the log difference clamped to [-20, 20] as in the PPO loss. ``tis``:
    ``min(w_raw, cap)`` (cap 2.0 when None); ``decoupled``: ``w_raw``, 0 where it exceeds ``cap`` (no bound when
    None); ``none``: 1. Statistics over the masked tokens (0 when there are none): ``actor/is_weight_mean`` and
    ``actor/is_weight_max`` of the weight the loss uses, ``actor/is_capped_share`` the share of tokens the cap
    truncated (``tis``) or left out (``decoupled``), and ``actor/behaviour_kl``, the k1 estimate of
    KL(behaviour || proximal), ``mean(behaviour - proximal)``: unbiased because the tokens were sampled from the
    behaviour policy (a single token's term may be negative; their mean tends to a KL >= 0).
    """
    if mode not in OFF_POLICY_CORRECTIONS:
        raise ValueError(f"unknown off_policy_correction {mode!r}; use one of {', '.join(OFF_POLICY_CORRECTIONS)}")
    with torch.no_grad():
        proximal, behaviour = proximal_logprobs.detach().float(), behaviour_logprobs.detach().float()
        on_mask = mask > 0
        weights_mask = on_mask.float()
        raw = torch.exp(torch.clamp(proximal - behaviour, min=-20.0, max=20.0))  # (B, T)
        capped = torch.zeros_like(on_mask)
        if mode == "none":
            weights = torch.ones_like(raw)
        elif mode == "tis":
            bound = TIS_DEFAULT_CAP if cap is None else cap
            capped = raw > bound
            weights = torch.clamp(raw, max=bound)
        else:
            weights = raw
            if cap is not None:
                capped = raw > cap
                weights = torch.where(capped, torch.zeros_like(raw), raw)
        weights = torch.where(on_mask, weights, torch.zeros_like(weights))
        stats = {
            "actor/is_weight_mean": float(masked_mean(weights, weights_mask)),
            "actor/is_weight_max": float(weights.max()) if bool(on_mask.any()) else 0.0,
            "actor/is_capped_share": float(masked_mean((capped & on_mask).float(), weights_mask)),
            "actor/behaviour_kl": float(masked_mean(torch.where(on_mask, behaviour - proximal, 0.0), weights_mask)),
        }
    return weights, stats
