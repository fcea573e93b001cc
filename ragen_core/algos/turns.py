"""Turn structure of a multi-turn sequence: the contiguous runs of 1s in the response mask are the turns.

The whole chat is one sequence; the response mask is 1 on assistant tokens and 0 on the prompt, on the environment's
text between turns and on padding, so turn k of row b is its k-th maximal run of masked tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def turn_ends(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True on the last token of each turn (a masked token followed by an unmasked one or the end)."""
    on = response_mask > 0  # (B, T)
    next_on = torch.zeros_like(on)
    next_on[:, :-1] = on[:, 1:]
    return on & ~next_on


def turn_starts(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True on the first token of each turn."""
    on = response_mask > 0  # (B, T)
    previous_on = torch.zeros_like(on)
    previous_on[:, 1:] = on[:, :-1]
    return on & ~previous_on


def turn_index(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: the turn number (0, 1, ...) of each masked token, -1 on unmasked tokens."""
    index = torch.cumsum(turn_starts(response_mask).long(), dim=1) - 1  # (B, T)
    return torch.where(response_mask > 0, index, torch.full_like(index, -1))


def turn_sums(token_values: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of ``token_values`` over each turn's tokens: ``(sums (B, K), turn_valid (B, K) bool)``, K = most turns
    in a row; rows with fewer turns are padded with 0 / False. Values on unmasked tokens are ignored."""
    index = turn_index(response_mask)  # (B, T)
    num_turns = int(index.max().item()) + 1 if index.numel() else 0
    sums = torch.zeros(token_values.shape[0], num_turns + 1, dtype=token_values.dtype)
    # Unmasked tokens go to a spare last column, dropped below.
    column = torch.where(index >= 0, index, torch.full_like(index, num_turns))
    sums.scatter_add_(1, column, token_values)
    counts = turn_starts(response_mask).sum(dim=1)  # (B,)
    turn_valid = torch.arange(num_turns)[None, :] < counts[:, None]  # (B, K)
    return sums[:, :num_turns], turn_valid


def place_turn_rewards(response_mask: torch.Tensor, turn_rewards: Sequence[Sequence[float]]) -> torch.Tensor:
    """Token rewards (B, T): ``turn_rewards[b][k]`` on the last token of row b's k-th turn, 0 elsewhere.

    Raises ``ValueError`` when a row's number of rewards differs from its number of turns.
    """
    if len(turn_rewards) != response_mask.shape[0]:
        raise ValueError(f"{len(turn_rewards)} reward lists for a batch of {response_mask.shape[0]} sequences")
    ends = turn_ends(response_mask)  # (B, T)
    token_rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    for row, rewards in enumerate(turn_rewards):
        positions = ends[row].nonzero(as_tuple=True)[0]
        if len(positions) != len(rewards):
            raise ValueError(
                f"row {row}: {len(rewards)} turn rewards but the response mask has {len(positions)} turns "
                "(contiguous runs of 1s); give one reward per assistant turn"
            )
        token_rewards[row, positions] = torch.as_tensor(list(rewards), dtype=torch.float32)
    return token_rewards
