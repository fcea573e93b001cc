"""The rollout room: multi-turn rollouts (the engine), the samplers they come from (Hugging Face generate, the sampler
process, the vLLM server, scripted policies) behind one interface (:mod:`.sampling`: a :class:`Sampler` samples a
turn's prompts, takes new weights, closes), the policy a session's rollouts use (:mod:`.policy`), the backends by name
(:mod:`.samplers`) and the weight hand-off between processes (:mod:`.handoff`)."""

from ragen_core.rollout.engine import END_REASONS, PromptTooLongError, RolloutBackend, RolloutSpec, run_rollouts
from ragen_core.rollout.sampling import NewWeights, Sampler, SamplerBackend, Sampling
from ragen_core.rollout.scripted import ScriptedBackend, get_scripted_policy, registered_scripted_policies
from ragen_core.rollout.types import Generation, TrajectoryRecord, TurnContext, TurnRecord

__all__ = [
    "END_REASONS",
    "Generation",
    "NewWeights",
    "PromptTooLongError",
    "RolloutBackend",
    "RolloutSpec",
    "Sampler",
    "SamplerBackend",
    "Sampling",
    "ScriptedBackend",
    "TrajectoryRecord",
    "TurnContext",
    "TurnRecord",
    "get_scripted_policy",
    "registered_scripted_policies",
    "run_rollouts",
]
