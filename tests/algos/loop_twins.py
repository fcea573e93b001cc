"""Independent plain-Python versions of the vectorised algorithms, one row and one token at a time.

They work on lists, find turns by walking the mask, and run each recursion over the compacted list of masked tokens,
so a shared bug with the tensor code is unlikely.
"""

from __future__ import annotations

import math
import statistics


def runs(mask: list[float]) -> list[list[int]]:
    """Positions of each contiguous run of masked tokens (the turns)."""
    turns: list[list[int]] = []
    previous = False
    for t, m in enumerate(mask):
        if m > 0:
            if not previous:
                turns.append([])
            turns[-1].append(t)
        previous = m > 0
    return turns


def whiten(rows: list[list[float]], masks: list[list[float]]) -> list[list[float]]:
    """Whiten the masked entries of all rows together (sample variance), 0 elsewhere."""
    flat = [v for row, mask in zip(rows, masks, strict=True) for v, m in zip(row, mask, strict=True) if m > 0]
    mean = statistics.fmean(flat)
    var = statistics.variance(flat) if len(flat) > 1 else 0.0
    scale = 1.0 / math.sqrt(var + 1e-8)
    return [
        [(v - mean) * scale if m > 0 else 0.0 for v, m in zip(row, mask, strict=True)]
        for row, mask in zip(rows, masks, strict=True)
    ]


def group_baseline(scores: list[float], groups: list[int], leave_one_out: bool) -> list[float]:
    """Mean of the group (or of the other members); 0 for single-member groups."""
    out = []
    for i, group in enumerate(groups):
        members = [j for j, g in enumerate(groups) if g == group]
        if len(members) == 1:
            out.append(0.0)
        elif leave_one_out:
            out.append(sum(scores[j] for j in members if j != i) / (len(members) - 1))
        else:
            out.append(statistics.fmean(scores[j] for j in members))
    return out


def gae_row(rewards: list[float], values: list[float], mask: list[float], gamma: float, lam: float):
    """Classic GAE over the compacted masked tokens of one row: (advantages, returns), 0 off the mask."""
    positions = [t for t, m in enumerate(mask) if m > 0]
    advantages = [0.0] * len(mask)
    lastgaelam, next_value = 0.0, 0.0
    for t in reversed(positions):
        delta = rewards[t] + gamma * next_value - values[t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages[t] = lastgaelam
        next_value = values[t]
    returns = [a + v if m > 0 else 0.0 for a, v, m in zip(advantages, values, mask, strict=True)]
    return advantages, returns


def bi_level_gae_row(
    rewards: list[float], values: list[float], mask: list[float], gamma: float, lam: float, high_gamma: float
):
    """RAGEN's bi-level GAE on one row: turn-level GAE, then token-level GAE inside each turn."""
    turns = runs(mask)
    turn_reward = [sum(rewards[t] for t in turn) for turn in turns]
    turn_value = [values[turn[-1]] for turn in turns]
    turn_adv = [0.0] * len(turns)
    lastgaelam = 0.0
    for k in reversed(range(len(turns))):
        next_value = turn_value[k + 1] if k + 1 < len(turns) else 0.0
        lastgaelam = turn_reward[k] + high_gamma * next_value - turn_value[k] + high_gamma * lam * lastgaelam
        turn_adv[k] = lastgaelam
    advantages = [0.0] * len(mask)
    for turn, adv in zip(turns, turn_adv, strict=True):
        advantages[turn[-1]] = adv
        for i in reversed(range(len(turn) - 1)):
            t = turn[i]
            delta = gamma * values[turn[i + 1]] - values[t]
            advantages[t] = delta + gamma * lam * advantages[turn[i + 1]]
    returns = [a + v if m > 0 else 0.0 for a, v, m in zip(advantages, values, mask, strict=True)]
    return advantages, returns


def returns_to_go_row(rewards: list[float], mask: list[float], gamma: float) -> list[float]:
    """Discounted return-to-go over the compacted masked tokens, 0 off the mask."""
    out = [0.0] * len(mask)
    running = 0.0
    for t in reversed([t for t, m in enumerate(mask) if m > 0]):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def ppo_token_loss(ratio: float, advantage: float, clip_low: float, clip_high: float, clip_c: float | None) -> float:
    """The (dual-)clipped PPO loss of one token, by cases."""
    clipped_ratio = min(max(ratio, 1.0 - clip_low), 1.0 + clip_high)
    loss = max(-advantage * ratio, -advantage * clipped_ratio)
    if clip_c is not None and advantage < 0:
        loss = min(loss, -advantage * clip_c)
    return loss
