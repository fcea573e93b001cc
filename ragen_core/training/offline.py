"""The offline update math over stored rows: one supervised epoch (``sft``) or one policy-gradient pass (``pg``) of the
actor on trajectories exactly as stored (token ids, loss masks, behaviour log-probs, rewards).

``pg``: the StarPO policy loss with the stored behaviour log-probs as the old policy, so the ratio ``pi / mu`` is the
importance weight, bounded by PPO's clip for positive advantages and by the dual-clip bound (``offline.is_bound``)
for negative ones; advantages are recomputed from the stored rewards with the configured (critic-free) estimator.
Which rows, which start model and which run they train: :mod:`ragen_core.run.offline`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import torch

from ragen_core.algos import critic_free_estimators, needs_critic
from ragen_core.config import RunConfig
from ragen_core.update.advantages import compute_advantages, token_rewards_for
from ragen_core.update.inputs import UpdateInputs
from ragen_core.update.rows import TokenRows
from schemas.tables import TRAJECTORY_KEY


class OfflineError(ValueError):
    """The selection cannot be re-trained on as asked; the message says why and how to fix it."""


def offline_inputs(table: pa.Table, pad_token_id: int, behaviour: bool = False) -> UpdateInputs:
    """Token batch, scores and groups of the selected rows; groups are (run, iteration, split, env, group). With
    ``behaviour``: their stored behaviour log-probs too (:func:`behavior_logprobs`'s rules)."""
    tokens = TokenRows.from_table(table, logprobs=behaviour)
    batch = tokens.batch(pad_token_id)
    group_keys = list(zip(*(table[k].to_pylist() for k in TRAJECTORY_KEY[:-1]), strict=True))
    ids = {key: i for i, key in enumerate(dict.fromkeys(group_keys))}
    return UpdateInputs(
        batch=batch,
        scores=torch.tensor(table["total_reward"].to_numpy(), dtype=torch.float32),
        group_index=torch.tensor([ids[key] for key in group_keys], dtype=torch.long),
        behavior_logprobs=behavior_logprobs(table, tokens, batch.loss_mask.shape[1]) if behaviour else None,
    )


def behavior_logprobs(table: pa.Table, tokens: TokenRows, width: int) -> torch.Tensor:
    """(B, ``width``) the stored behaviour log-probs of ``table``'s rows (``tokens``: the rows read with their
    log-probs); refuses scripted rows, which have none."""
    sources = set(table["behavior_source"].to_pylist())
    if sources != {"policy"}:
        raise OfflineError(
            "pg mode needs the behaviour log-probs of the policy that generated each trajectory; the selection "
            f"holds rows with behavior_source {sorted(sources - {'policy'})} (scripted demonstrations have none). "
            "Use --mode sft for them, or select only policy rows (WHERE behavior_source = 'policy')"
        )
    out = tokens.padded_logprobs(width)
    if out is None:
        raise OfflineError("some selected policy rows have no stored behaviour log-probs; select rows that have them")
    return out


def pg_update(config: RunConfig, actor: Any, table: pa.Table, pad_token_id: int, seed: int) -> dict[str, float]:
    """One offline policy-gradient pass: StarPO's loss with the stored behaviour log-probs as the old policy."""
    estimator = config.algorithm.adv_estimator
    if needs_critic(estimator):
        free = ", ".join(critic_free_estimators())
        raise OfflineError(f"offline pg uses an estimator without a critic ({free}), not {estimator}")
    inputs = offline_inputs(table, pad_token_id, behaviour=True)
    mask, old = inputs.batch.loss_mask, inputs.behavior_logprobs
    token_rewards = token_rewards_for(inputs, "trajectory")
    advantages, _ = compute_advantages(config.algorithm, token_rewards, mask, inputs.group_index, None)
    algorithm = config.algorithm
    if config.offline.is_bound is not None:  # the importance weight of a negative advantage bounded by dual clip
        algorithm = algorithm.model_copy(update={"policy_loss": "dual_clip", "clip_ratio_c": config.offline.is_bound})
    metrics = actor.policy_update(inputs.batch, advantages, old, algorithm, config.actor, seed)
    metrics["offline/trajectories"] = float(table.num_rows)
    return metrics


def sft_update(actor: Any, table: pa.Table, pad_token_id: int, batch_size: int, seed: int) -> dict[str, float]:
    """One supervised epoch on the selected rows' loss-masked tokens."""
    batch = TokenRows.from_table(table).batch(pad_token_id)
    metrics = actor.sft_update(batch, batch_size, seed)
    metrics["offline/trajectories"] = float(table.num_rows)
    return metrics
