"""An iteration's update inputs, read from the lake: the published training rows the filter kept.

The one-process updater and every rank of a launched group read them the same way, so both update on the same
batch in the same order; so does the viewer, which shows each token's advantage in that update
(:func:`ragen_core.update.advantages.update_advantages`) and finds a trajectory's row by the inputs' ``keys``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import torch

from ragen_core.config import RunConfig
from ragen_core.storage import DataLake
from ragen_core.update.rows import TokenBatch, TokenRows, policy_sampled, turn_rows_of_table


@dataclass(frozen=True)
class UpdateInputs:
    """The kept trajectories of one iteration, as the update needs them."""

    batch: TokenBatch
    scores: torch.Tensor  # (B,) trajectory scores (env rewards + format penalties)
    group_index: torch.Tensor  # (B,) initial-state group of each trajectory
    turn_rewards: Sequence[Sequence[float]] | None = None  # per trajectory, each turn's reward + penalty
    behavior_logprobs: torch.Tensor | None = None  # (B, T) the sampler's stored log-probs; None: some row has none
    kept_group_share: float = 1.0  # groups the filter kept / groups of the iteration (filter_loss_scaling)
    episode_index: torch.Tensor | None = None  # (B,) turn rows: each row's trajectory; None: rows are trajectories
    kl_mask: torch.Tensor | None = None  # (B, T) the tokens the KL term covers (algorithm.kl_span); None: all trained
    keys: Sequence[tuple[int, int]] = ()  # each row's trajectory (group_id, traj_index); empty: rows not of the lake


def update_inputs(
    lake: DataLake, run_id: str, iteration: int, config: RunConfig, pad_token_id: int
) -> UpdateInputs | None:
    """The published, kept training rows of ``iteration`` as update inputs, in (group, trajectory) order (with
    ``rollout.training_rows=turn``: one row per turn, see :func:`turn_update_inputs`), with
    per-turn rewards when ``algorithm.reward_level`` is ``turn``; None when the filter kept no group (no update). An
    iteration without any published training row is an error (nothing was generated, or its commit is missing), not
    a skip. ``kept_group_share`` is the share of the iteration's groups that were kept. The partition is read
    once."""
    rows = lake.read_table("trajectories", run_id, iteration)
    train = pc.equal(rows["split"], "train")
    if not pc.any(train).as_py():
        raise RuntimeError(
            f"iteration {iteration} of {run_id} has no kept training rows to update on: "
            "no training rows were published for it"
        )
    groups = pc.count_distinct(rows.filter(train)["group_id"]).as_py()
    rows = rows.filter(pc.and_(train, pc.fill_null(rows["kept"], False)))
    if rows.num_rows == 0:
        return None
    rows = rows.sort_by([("group_id", "ascending"), ("traj_index", "ascending")])
    kept_share = pc.count_distinct(rows["group_id"]).as_py() / groups
    if config.rollout.training_rows == "turn":
        return turn_update_inputs(rows, pad_token_id, kept_share)
    tokens = TokenRows.from_table(rows, logprobs=policy_sampled(rows))
    batch = tokens.batch(pad_token_id)
    keys = trajectory_keys(rows)
    turn_rewards = None
    if config.algorithm.reward_level == "turn":
        turns = lake.read_table("turns", run_id, iteration).to_pandas()
        turns = turns[turns["split"] == "train"].sort_values("turn_index")
        by_key = {
            key: list(group["reward"] + group["penalty"])
            for key, group in turns.groupby(["group_id", "traj_index"], sort=False)
        }
        turn_rewards = [by_key[key] for key in keys]
    return UpdateInputs(
        batch=batch,
        scores=torch.tensor(rows["total_reward"].to_numpy(), dtype=torch.float32),
        group_index=torch.tensor(rows["group_id"].to_numpy(), dtype=torch.long),
        turn_rewards=turn_rewards,
        behavior_logprobs=tokens.padded_logprobs(batch.loss_mask.shape[1]),
        kept_group_share=kept_share,
        keys=keys,
    )


def trajectory_keys(rows: pa.Table) -> list[tuple[int, int]]:
    """``(group_id, traj_index)`` of each row of a table of one iteration's training rows, in its order."""
    return list(zip(rows["group_id"].to_pylist(), rows["traj_index"].to_pylist(), strict=True))


def turn_update_inputs(rows: pa.Table, pad_token_id: int, kept_share: float) -> UpdateInputs:
    """``rollout.training_rows=turn``: every turn of the kept trajectories ``rows`` (in their order) is its own
    training row (:func:`ragen_core.update.rows.turn_rows_of_table`), carrying its trajectory's score, group and key,
    with its trajectory as ``episode_index`` (GRPO's statistics count each trajectory once, as RAGEN-2's)."""
    turns = turn_rows_of_table(rows)
    batch = turns.tokens.batch(pad_token_id)
    keys = trajectory_keys(rows)
    index = torch.tensor(turns.trajectory, dtype=torch.long)
    return UpdateInputs(
        batch=batch,
        scores=torch.tensor(rows["total_reward"].to_numpy(), dtype=torch.float32)[index],
        group_index=torch.tensor(rows["group_id"].to_numpy(), dtype=torch.long)[index],
        behavior_logprobs=turns.tokens.padded_logprobs(batch.loss_mask.shape[1]),
        kept_group_share=kept_share,
        episode_index=index,
        keys=[keys[i] for i in turns.trajectory],
    )
