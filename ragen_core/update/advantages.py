"""The advantage of each token in an update, from its inputs: the token rewards (each trajectory's score on its last
trained token, or each turn's reward on that turn's last), the registered estimator (``algorithm.adv_estimator``),
then RAGEN-2's scalings (the soft reweighting by group reward std, the filter's loss scaling).

:func:`update_advantages` is the one path: the StarPO update (:func:`ragen_core.training.starpo.starpo_update`)
trains on what it returns, and the viewer (``ragen view``) shows what it returns for the same inputs
(:func:`ragen_core.update.inputs.update_inputs`), so the advantage a page shows is the update's, bit for bit.
Offline re-training (``pg``) takes the estimator's alone (:func:`compute_advantages`).
"""

from __future__ import annotations

import torch

from ragen_core.algos import ADVANTAGES, place_turn_rewards
from ragen_core.algos.reweighting import filter_loss_scale, soft_advantage_weights
from ragen_core.config import AlgorithmConfig
from ragen_core.update.inputs import UpdateInputs


def trajectory_token_rewards(loss_mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(B, T) token rewards with each trajectory's score on its last assistant token."""
    token_rewards = torch.zeros_like(loss_mask, dtype=torch.float32)
    last_token = (loss_mask * torch.arange(loss_mask.shape[1])).argmax(dim=1)  # (B,)
    token_rewards[torch.arange(loss_mask.shape[0]), last_token] = scores.float()
    return token_rewards


def token_rewards_for(inputs: UpdateInputs, reward_level: str) -> torch.Tensor:
    """Token rewards at the configured level ('trajectory' or 'turn'); both sum to the trajectory scores."""
    if reward_level == "trajectory":
        return trajectory_token_rewards(inputs.batch.loss_mask, inputs.scores)
    if reward_level == "turn":
        if inputs.turn_rewards is None:
            raise ValueError("reward_level='turn' needs the per-turn rewards of every trajectory")
        return place_turn_rewards(inputs.batch.loss_mask, inputs.turn_rewards)
    raise ValueError(f"unknown reward_level {reward_level!r}; use 'trajectory' or 'turn'")


def compute_advantages(
    algorithm: AlgorithmConfig,
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor,
    values: torch.Tensor | None,
    episode_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (B, T) from the registered estimator ``algorithm.adv_estimator``, which reads the
    options it declares from ``algorithm``; ``values`` reach the critic estimators and ``episode_index`` (turn rows)
    lets GRPO count each trajectory once in its group statistics."""
    return ADVANTAGES.call(
        algorithm.adv_estimator, algorithm, token_rewards, mask, groups, values=values, episode_index=episode_index
    )


def scaled_advantages(
    algorithm: AlgorithmConfig,
    advantages: torch.Tensor,
    token_rewards: torch.Tensor,
    inputs: UpdateInputs,
    metrics: dict[str, float],
) -> torch.Tensor:
    """RAGEN-2's scalings after the estimator, in its order: the soft reweighting by group reward std
    (``soft_advantage_reweight``, over the summed token rewards GRPO normalised), then ``filter_loss_scaling`` by
    the share of groups the filter kept. Their factors are logged in ``metrics``."""
    if algorithm.soft_advantage_reweight:
        weights = soft_advantage_weights(token_rewards.sum(dim=-1), inputs.group_index, inputs.episode_index)
        advantages = advantages * weights.unsqueeze(-1).to(advantages.dtype)
        metrics.update(
            {
                "actor/soft_reweight_min": float(weights.min()),
                "actor/soft_reweight_max": float(weights.max()),
                "actor/soft_reweight_mean": float(weights.mean()),
            }
        )
    if algorithm.filter_loss_scaling != "none":
        scale = filter_loss_scale(algorithm.filter_loss_scaling, inputs.kept_group_share)
        advantages = advantages * scale
        metrics["actor/filter_loss_scale"] = scale
    return advantages


def update_advantages(
    algorithm: AlgorithmConfig,
    inputs: UpdateInputs,
    token_rewards: torch.Tensor,
    values: torch.Tensor | None = None,
    metrics: dict[str, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantages (B, T) an update of ``inputs`` trains on, before any off-policy weight, and the estimator's
    returns (the critic's targets): :func:`compute_advantages` over the batch's loss mask, groups and episodes, then
    :func:`scaled_advantages` (their factors into ``metrics`` when given). ``token_rewards``: :func:`token_rewards_for`
    the inputs, with the KL penalty already in them where ``algorithm.kl_mode`` is ``reward``; ``values``: the
    critic's, for the estimators that take them."""
    mask = inputs.batch.loss_mask
    advantages, returns = compute_advantages(
        algorithm, token_rewards, mask, inputs.group_index, values, inputs.episode_index
    )
    advantages = scaled_advantages(algorithm, advantages, token_rewards, inputs, {} if metrics is None else metrics)
    return advantages, returns
