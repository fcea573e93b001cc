"""One StarPO update, as the paper defines it, over a batch of kept trajectories.

score (old and reference log-probs) -> token rewards (trajectory score on the last assistant token, or each turn's
reward on that turn's last token) -> [KL in the reward] -> [critic values] -> advantages (the registered estimator,
then RAGEN-2's scalings: :func:`ragen_core.update.advantages.update_advantages`, by which the viewer shows a token's
advantage too) -> [off-policy importance weights on the advantages] -> actor PPO steps (registered policy loss) ->
[critic steps towards the returns]. Each step is a small function so the equations can be tested on their own;
:func:`starpo_update` chains them.
"""

from __future__ import annotations

import torch

from ragen_core.algos import apply_kl_penalty, behaviour_weights, needs_critic, value_metrics
from ragen_core.algos.masked import masked_mean
from ragen_core.config import AlgorithmConfig, CriticConfig, RunConfig
from ragen_core.faults import maybe_fail
from ragen_core.seeding import derive_seed
from ragen_core.training.actor import ActorEngine
from ragen_core.training.critic import CriticEngine
from ragen_core.update.advantages import token_rewards_for, update_advantages
from ragen_core.update.inputs import UpdateInputs


def critic_schedule(config: RunConfig) -> CriticConfig:
    """The critic section with its unset sizes (``mini_batch_size``, ``ppo_epochs``) set to the actor's."""
    critic, actor = config.critic, config.actor
    return critic.model_copy(
        update={
            "mini_batch_size": critic.mini_batch_size or actor.mini_batch_size,
            "ppo_epochs": critic.ppo_epochs or actor.ppo_epochs,
        }
    )


def reuses_behavior_logprobs(config: RunConfig, inputs: UpdateInputs, precision: str) -> bool:
    """Whether the update takes the stored behaviour log-probs for the old log-probs (actor.reuse_behavior_logprobs).

    ``auto``: only when they are the current policy's log-probs up to float summation order: sampled by this
    policy's weights through Hugging Face ``generate`` (vLLM's kernels differ), at temperature 1 without top-k/top-p
    (which change the distribution), in fp32 (bf16/fp16 rounding between a cached generation and a full forward is
    ~1e-2), and every row sampled by the policy (scripted rows have none). In a synchronous run updates happen
    between rollouts, so the weights that sampled an iteration's batch are those that update on it; in an
    asynchronous one (``trainer.max_staleness`` >= 1) an older policy sampled it, so ``auto`` re-scores (``always``
    still takes the stored values, as told).
    """
    mode = config.actor.reuse_behavior_logprobs
    if mode == "never":
        return False
    if mode == "always":
        if inputs.behavior_logprobs is None:
            raise ValueError(
                "actor.reuse_behavior_logprobs=always, but some kept rows have no behaviour log-probs (scripted "
                "rows); use auto or never"
            )
        return True
    rollout = config.rollout
    return (
        inputs.behavior_logprobs is not None
        and config.trainer.max_staleness == 0
        and rollout.backend == "hf"
        and rollout.temperature == 1.0
        and rollout.top_p in (1.0, None)
        and not rollout.top_k
        and precision == "fp32"
    )


def uses_stored_logprobs(config: RunConfig, inputs: UpdateInputs, precision: str) -> bool:
    """Whether the update's old log-probs are the stored behaviour ones: never with an off-policy correction (the
    old log-probs are then the proximal policy's, the batch re-scored; a batch without stored log-probs is refused),
    else as :func:`reuses_behavior_logprobs` says."""
    correction = config.algorithm.off_policy_correction
    if correction != "none" and inputs.behavior_logprobs is None:
        raise ValueError(
            f"algorithm.off_policy_correction={correction} needs the sampler's stored log-probs of every kept row, "
            "which scripted rows lack"
        )
    return correction == "none" and reuses_behavior_logprobs(config, inputs, precision)


def corrected_advantages(
    algorithm: AlgorithmConfig,
    advantages: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    inputs: UpdateInputs,
    metrics: dict[str, float],
) -> torch.Tensor:
    """The advantages times each token's importance weight proximal / behaviour
    (:func:`ragen_core.algos.off_policy.behaviour_weights`, its statistics into ``metrics``) under
    ``algorithm.off_policy_correction``; as they are with ``none``."""
    if algorithm.off_policy_correction == "none" or inputs.behavior_logprobs is None:
        return advantages
    correction, mask = algorithm.off_policy_correction, inputs.batch.loss_mask
    weights, stats = behaviour_weights(proximal_logprobs, inputs.behavior_logprobs, mask, correction, algorithm.is_cap)
    metrics.update(stats)
    return advantages * weights.to(advantages.dtype)


def starpo_update(
    config: RunConfig, actor: ActorEngine, critic: CriticEngine | None, inputs: UpdateInputs, iteration: int
) -> dict[str, float]:
    """One StarPO update of the actor (and the critic, for gae / bi_level_gae); returns namespaced metrics.

    The old log-probs are the stored behaviour log-probs when :func:`reuses_behavior_logprobs` says so (then
    ``actor/behavior_logprob_gap`` watches that they are the policy's), else the batch re-scored by the actor. With
    ``algorithm.off_policy_correction`` they are always the re-scored ones (the proximal policy, whatever
    ``actor.reuse_behavior_logprobs`` says), and each token's advantage is multiplied by its importance weight
    proximal / behaviour (:func:`ragen_core.algos.off_policy.behaviour_weights`) after the advantage metrics are
    taken: ``actor/advantage_mean`` and ``actor/advantage_abs_mean`` stay those of the unweighted advantages."""
    algorithm, batch = config.algorithm, inputs.batch
    mask = batch.loss_mask
    reuse = uses_stored_logprobs(config, inputs, actor.optim.precision)
    old_logprobs = inputs.behavior_logprobs if reuse and inputs.behavior_logprobs is not None else actor.score(batch)
    ref_logprobs = actor.reference_logprobs(batch) if algorithm.kl_coef > 0 else None
    token_rewards = token_rewards_for(inputs, algorithm.reward_level)
    metrics: dict[str, float] = {}
    if algorithm.kl_mode == "reward" and ref_logprobs is not None:
        kl_mask = mask if inputs.kl_mask is None else mask * inputs.kl_mask
        token_rewards, mean_kl = apply_kl_penalty(
            token_rewards, old_logprobs, ref_logprobs, kl_mask, algorithm.kl_coef, algorithm.kl_estimator
        )
        metrics["actor/reward_kl"] = float(mean_kl)
    critic_needed = needs_critic(algorithm.adv_estimator)
    if critic_needed and critic is None:
        raise ValueError(f"adv_estimator {algorithm.adv_estimator!r} needs a critic; the session has none")
    values = critic.values(batch) if critic_needed else None
    advantages, returns = update_advantages(algorithm, inputs, token_rewards, values, metrics)
    metrics["actor/advantage_mean"] = float(masked_mean(advantages, mask))
    metrics["actor/advantage_abs_mean"] = float(masked_mean(advantages.abs(), mask))
    advantages = corrected_advantages(algorithm, advantages, old_logprobs, inputs, metrics)
    seed = derive_seed(config.seed, iteration, "update_shuffle")
    metrics.update(
        actor.policy_update(
            batch,
            advantages,
            old_logprobs,
            algorithm,
            config.actor,
            seed,
            ref_logprobs if algorithm.kl_mode == "loss" else None,
            watch_old_gap=reuse,
            kl_mask=inputs.kl_mask,
        )
    )
    maybe_fail("update", "inside", iteration)  # the actor has stepped in memory; nothing is saved or committed
    if critic is not None and values is not None:
        metrics.update(value_metrics(values, returns, mask))
        critic_seed = derive_seed(config.seed, iteration, "critic_shuffle")
        metrics.update(critic.update(batch, values, returns, mask, algorithm, critic_schedule(config), critic_seed))
    metrics["actor/trained_tokens"] = float(mask.sum())
    return metrics
