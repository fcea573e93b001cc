"""Training: the DeepSpeed actor engine, batching and per-token log-probs."""

from ragen_core.training.actor import ActorEngine, OptimConfig, PolicyUpdateConfig
from ragen_core.training.batch import TokenBatch, collate, token_logprobs

__all__ = ["ActorEngine", "OptimConfig", "PolicyUpdateConfig", "TokenBatch", "collate", "token_logprobs"]
