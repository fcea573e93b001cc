"""Advantage estimators: pure functions over token-level tensors, registered by name.

One signature for all: ``fn(token_rewards (B, T), response_mask (B, T), group_index (B,), **options)
-> (advantages (B, T), returns (B, T))``. Estimators that need a critic take ``values=`` (B, T), GRPO takes
``episode_index=`` (turn rows); :meth:`Registry.call` hands each only the inputs it takes. An estimator declares its
config options where it is registered (``@register_advantage("gae", options=("gamma", "lam", ...))``: fields of
``algorithm``), and the caller passes the config section: a new option is said at the estimator and at the field.

Conventions. The whole multi-turn chat is one sequence: ``response_mask`` is 1 on assistant tokens only, so its
contiguous runs of 1s are the turns (:mod:`ragen_core.algos.turns`). The trajectory reward sits on the last
assistant token, and per-turn rewards, when there are any, on each turn's last token; a trajectory's score is
``token_rewards.sum(-1)``. Rewards on unmasked tokens are ignored by the token-level estimators. Both outputs are 0
outside the mask.
"""

from __future__ import annotations

import torch

from ragen_core.algos.masked import masked_whiten
from ragen_core.algos.turns import turn_ends, turn_index, turn_sums
from ragen_core.registry import Registry, keyword_parameters

ADVANTAGES: Registry = Registry("advantage estimator")
register_advantage = ADVANTAGES.register


def needs_critic(estimator: str) -> bool:
    """Whether the advantage estimator ``estimator`` (``algorithm.adv_estimator``) needs a value model: it takes the
    critic's ``values`` (an unknown estimator is refused when the config is loaded, naming the registered ones)."""
    return estimator in ADVANTAGES and "values" in keyword_parameters(ADVANTAGES.get(estimator))


def critic_free_estimators() -> list[str]:
    """The registered advantage estimators that need no value model, sorted: what a run without a critic (an
    offline ``pg`` re-training) may choose."""
    return [name for name in ADVANTAGES.names() if not needs_critic(name)]


def _group_sums(values: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(group_sum (B,), group_size (B,), inverse (B,))``: each trajectory's group total and member count."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=values.dtype).index_add_(0, inverse, values)
    return sums[inverse], counts[inverse].to(values.dtype), inverse


def group_mean_std(
    scores: torch.Tensor, group_index: torch.Tensor, episode_index: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-trajectory mean and (unbiased) std of its group's scores; single-member groups get mean 0, std 1
    (as veRL does), so their advantage is the raw score.

    ``episode_index`` (turn rows: the trajectory of each row): each (group, episode) pair counts once, with the
    score of its first row, as RAGEN-2's ``compute_grpo_outcome_advantage`` deduplicates its turn-level samples; a
    group is then single-member when it holds one episode, however many rows."""
    if episode_index is not None:
        return _episode_mean_std(scores, group_index, episode_index)
    group_sum, group_size, inverse = _group_sums(scores, group_index)  # (B,)
    mean = group_sum / group_size
    squares, _, _ = _group_sums((scores - mean).square(), group_index)
    std = torch.sqrt(squares / (group_size - 1).clamp(min=1.0))
    single = group_size == 1
    return torch.where(single, torch.zeros_like(mean), mean), torch.where(single, torch.ones_like(std), std)


def first_of_episode(group_index: torch.Tensor, episode_index: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the first row of each (group, episode) pair."""
    pairs = torch.stack([group_index.long(), episode_index.long()], dim=1)
    _, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    rows = torch.arange(len(inverse))
    first = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return torch.zeros(len(inverse), dtype=torch.bool).index_fill_(0, first, True)


def _episode_mean_std(
    scores: torch.Tensor, group_index: torch.Tensor, episode_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`group_mean_std` over one score per (group, episode), broadcast to every row of the group."""
    if len(scores) == 0:
        return scores.clone(), scores.clone()
    first = first_of_episode(group_index, episode_index)
    mean, std = group_mean_std(scores[first], group_index[first])  # (episodes,)
    groups, inverse = torch.unique(group_index[first], return_inverse=True)
    group_mean = torch.zeros(len(groups), dtype=mean.dtype).index_copy_(0, inverse, mean)
    group_std = torch.zeros(len(groups), dtype=std.dtype).index_copy_(0, inverse, std)
    where = torch.searchsorted(groups, group_index)
    return group_mean[where], group_std[where]


def _require_values(values: torch.Tensor | None, estimator: str) -> torch.Tensor:
    if values is None:
        raise ValueError(
            f"advantage estimator {estimator!r} needs critic values: pass values=(B, T) from the critic, or choose "
            f"an estimator without a critic ({', '.join(critic_free_estimators())})"
        )
    return values


@register_advantage("grpo", options={"norm_adv_by_std": "norm_adv_by_std", "grouping": "grpo_grouping"})
def grpo_advantage(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    norm_adv_by_std: bool = True,
    grouping: str = "state",
    epsilon: float = 1e-6,
    episode_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, eq. 3 outcome supervision): ``A_i = (R_i - mean(R_G)) / (std(R_G) + eps)``, the std
    division only when ``norm_adv_by_std``, broadcast to every response token.

    ``grouping="state"`` normalises within each group of rollouts from one initial state (``group_index``);
    ``grouping="batch"`` normalises over the whole batch. ``episode_index`` (per-turn training rows): the mean and
    std count each episode once, whatever its number of turn rows (RAGEN-2's deduplication); every row is
    normalised with them.
    """
    if grouping == "batch":
        group_index = torch.zeros_like(group_index)
    elif grouping != "state":
        raise ValueError(f"unknown grpo grouping {grouping!r}; use 'state' (per initial state) or 'batch'")
    scores = token_rewards.sum(dim=-1)  # (B,)
    mean, std = group_mean_std(scores, group_index, episode_index)
    advantage = scores - mean
    if norm_adv_by_std:
        advantage = advantage / (std + epsilon)
    advantages = advantage.unsqueeze(-1) * response_mask  # (B, T)
    return advantages, advantages


@register_advantage("rloo")
def rloo_advantage(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, group_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, eq. 6): ``A_i = R_i - 1/(n-1) sum_{j != i} R_j`` within the group of n rollouts
    of one initial state; a single-member group keeps its raw score (veRL)."""
    scores = token_rewards.sum(dim=-1)  # (B,)
    group_sum, group_size, _ = _group_sums(scores, group_index)
    leave_one_out_mean = (group_sum - scores) / (group_size - 1).clamp(min=1.0)
    baseline = torch.where(group_size > 1, leave_one_out_mean, torch.zeros_like(scores))
    advantages = (scores - baseline).unsqueeze(-1) * response_mask  # (B, T)
    return advantages, advantages


def discounted_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go over the masked tokens: ``G_t = r_t + gamma * G_{t'}``, t' the next masked token (0 past the
    last). Environment tokens between turns are skipped, so they neither discount nor cut the return."""
    mask = response_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])  # (B,)
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(mask[:, t] > 0, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    return returns


@register_advantage("reinforce_plus_plus", options=("gamma",))
def reinforce_plus_plus_advantage(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, eqs. 5-6): discounted return-to-go ``G_t = sum_{s >= t} gamma^(s-t) r_s`` over the
    masked tokens, whitened over all masked tokens of the batch: ``A_t = (G_t - mean G) / std G``.

    Unlike veRL, which resets the running return on every unmasked token (right for padding, but in a multi-turn
    sequence it would cut earlier turns off from later rewards), the recursion skips environment tokens.
    """
    returns = discounted_returns(token_rewards, response_mask, gamma)  # (B, T)
    return masked_whiten(returns, response_mask), returns


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, group_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline (veRL): ``R_i - mean(R_G)`` (mean 0 for a single-member group), broadcast to the
    response tokens, then whitened over all masked tokens of the batch."""
    scores = token_rewards.sum(dim=-1)  # (B,)
    mean, _ = group_mean_std(scores, group_index)
    centred = (scores - mean).unsqueeze(-1) * response_mask  # (B, T)
    advantages = masked_whiten(centred, response_mask)
    return advantages, advantages


def masked_gae(
    token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016, eq. 16) over the masked tokens only: with t' the next masked token after t,
    ``delta_t = r_t + gamma V_{t'} - V_t`` and ``A_t = delta_t + gamma lam A_{t'}`` (``V_{t'} = A_{t'} = 0`` past
    the last); returns ``A_t + V_t``. Unmasked (environment) tokens are skipped, as in veRL's multi-turn GAE."""
    mask = response_mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    lastgaelam = torch.zeros_like(values[:, 0])  # (B,)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * lastgaelam
        on = mask[:, t] > 0
        next_value = torch.where(on, values[:, t], next_value)
        lastgaelam = torch.where(on, gae_t, lastgaelam)
        advantages[:, t] = gae_t * mask[:, t]
    return advantages, (advantages + values) * mask


@register_advantage("gae", options=("gamma", "lam", "whiten_advantages"))
def gae_advantage(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten_advantages: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's GAE with a critic: :func:`masked_gae` (env text between turns does not discount), returns
    ``A_t + V_t`` as the critic's targets, advantages whitened over the batch's masked tokens when
    ``whiten_advantages`` (veRL and RAGEN always whiten)."""
    values = _require_values(values, "gae")
    advantages, returns = masked_gae(token_rewards, values, response_mask, gamma, lam)
    if whiten_advantages:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


def turn_level_gae(
    turn_rewards: torch.Tensor, turn_values: torch.Tensor, turn_valid: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """High-level GAE across turns (B, K): ``delta_k = R_k + gamma V_{k+1} - V_k``,
    ``A_k = delta_k + gamma lam A_{k+1}`` (``V_K = A_K = 0``); padded turns (``turn_valid`` False) are 0."""
    valid = turn_valid.to(turn_values.dtype)
    turn_advantages = torch.zeros_like(turn_values)
    next_value = torch.zeros_like(turn_values[:, 0])  # (B,)
    lastgaelam = torch.zeros_like(turn_values[:, 0])  # (B,)
    for k in reversed(range(turn_values.shape[1])):
        delta = turn_rewards[:, k] + gamma * next_value - turn_values[:, k]
        lastgaelam = (delta + gamma * lam * lastgaelam) * valid[:, k]
        next_value = turn_values[:, k] * valid[:, k]
        turn_advantages[:, k] = lastgaelam
    return turn_advantages


@register_advantage("bi_level_gae", options=("gamma", "lam", "high_level_gamma", "whiten_advantages"))
def bi_level_gae_advantage(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
    whiten_advantages: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RAGEN's bi-level (turn-level) GAE: a high-level MDP over turns, a low-level MDP over each turn's tokens.

    Turn k spans the masked tokens ``s_k..e_k``; its reward ``R_k`` is the sum of its token rewards (they sit on
    ``e_k``) and its value is the value of its last token, ``V_{e_k}``.

    High level, with ``gamma_h = high_level_gamma`` (``V_{e_K} = Â_K = 0``)::

        delta_k = R_k + gamma_h V_{e_{k+1}} - V_{e_k};   Â_k = delta_k + gamma_h lam Â_{k+1}

    Low level, inside turn k: the last token's target is ``Â_k + V_{e_k}``, so its advantage is ``Â_k``; then::

        A_{e_k} = Â_k;   delta_t = gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1}   (s_k <= t < e_k)

    Returns are ``A_t + V_t``; advantages are whitened over the batch's masked tokens when ``whiten_advantages``
    (as RAGEN does). As in RAGEN's ``compute_bi_level_gae_advantage_return`` the high level uses the same ``lam``;
    turns are taken from the mask (RAGEN takes them from the nonzero rewards, which misses zero-reward turns). With
    one turn per sequence this equals :func:`masked_gae` for any gammas and lam.
    """
    values = _require_values(values, "bi_level_gae")
    mask = response_mask.to(values.dtype)
    ends = turn_ends(response_mask)  # (B, T)
    turn_rewards, turn_valid = turn_sums(token_rewards * mask, response_mask)  # (B, K)
    turn_values, _ = turn_sums(values * ends, response_mask)  # (B, K): V at each turn's last token
    turn_advantages = turn_level_gae(turn_rewards, turn_values, turn_valid, high_level_gamma, lam)  # (B, K)
    if turn_advantages.shape[1] == 0:  # no masked token anywhere
        return torch.zeros_like(values), torch.zeros_like(values)
    at_end = turn_advantages.gather(1, turn_index(response_mask).clamp(min=0))  # (B, T): Â of the token's turn

    advantages = torch.zeros_like(values)
    lastgaelam = torch.zeros_like(values[:, 0])  # (B,)
    width = values.shape[1]
    for t in reversed(range(width)):
        next_value = values[:, t + 1] if t + 1 < width else torch.zeros_like(lastgaelam)
        within = gamma * next_value - values[:, t] + gamma * lam * lastgaelam
        # The previous token in the scan is in the same turn unless t ends a turn, which restarts the recursion.
        lastgaelam = torch.where(ends[:, t], at_end[:, t], within)
        advantages[:, t] = lastgaelam * mask[:, t]
    returns = (advantages + values) * mask
    if whiten_advantages:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns
