"""Training: the DeepSpeed actor and critic engines, batching, per-token log-probs and the StarPO update."""

from ragen_core.training.actor import ActorEngine, OptimConfig, update_schedule
from ragen_core.training.batch import collate, token_logprobs
from ragen_core.training.critic import CriticEngine, ValueModel
from ragen_core.update.rows import TokenBatch

__all__ = [
    "ActorEngine",
    "CriticEngine",
    "OptimConfig",
    "TokenBatch",
    "ValueModel",
    "collate",
    "token_logprobs",
    "update_schedule",
]
