"""Multi-turn rollouts: the engine and its backends (Hugging Face generate, scripted policies)."""

from ragen_core.rollout.engine import END_REASONS, PromptTooLongError, RolloutBackend, RolloutSpec, run_rollouts
from ragen_core.rollout.scripted import ScriptedBackend, get_scripted_policy, registered_scripted_policies
from ragen_core.rollout.types import Generation, TrajectoryRecord, TurnContext, TurnRecord

__all__ = [
    "END_REASONS",
    "Generation",
    "PromptTooLongError",
    "RolloutBackend",
    "RolloutSpec",
    "ScriptedBackend",
    "TrajectoryRecord",
    "TurnContext",
    "TurnRecord",
    "get_scripted_policy",
    "registered_scripted_policies",
    "run_rollouts",
]
