"""Training: the DeepSpeed actor and critic engines, batching, per-token log-probs and the StarPO update."""

from ragen_core.training.actor import ActorEngine, OptimConfig, PolicyUpdateConfig, update_schedule
from ragen_core.training.batch import TokenBatch, collate, token_logprobs
from ragen_core.training.critic import CriticEngine, ValueModel, ValueUpdateConfig

__all__ = [
    "ActorEngine",
    "CriticEngine",
    "OptimConfig",
    "PolicyUpdateConfig",
    "TokenBatch",
    "ValueModel",
    "ValueUpdateConfig",
    "collate",
    "token_logprobs",
    "update_schedule",
]
