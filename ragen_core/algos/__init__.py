"""StarPO algorithms: advantage estimators, policy losses and group filters, registered by name."""

from ragen_core.algos.advantages import ADVANTAGES, grpo_advantage, register_advantage
from ragen_core.algos.filters import FILTERS, groups_to_keep, in_group_std, register_filter
from ragen_core.algos.losses import POLICY_LOSSES, aggregate_loss, entropy_from_logits, kl_penalty, ppo_clip_loss

__all__ = [
    "ADVANTAGES",
    "FILTERS",
    "POLICY_LOSSES",
    "aggregate_loss",
    "entropy_from_logits",
    "grpo_advantage",
    "groups_to_keep",
    "in_group_std",
    "kl_penalty",
    "ppo_clip_loss",
    "register_advantage",
    "register_filter",
]
