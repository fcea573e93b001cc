"""The reward of the arithmetic example: 1 for the exact sum, else 0, with feedback for the next turn.

A reward function of the dataset env is called as ``score(completion, **columns)``: the answer the reply gave (the
text inside ``<answer>``) and every column of the prompt's row except the prompt itself. It returns the score, or
``(score, feedback)``; the feedback is shown under the prompt at the next turn while turns are left.
"""

from __future__ import annotations

from typing import Any


def score(completion: str, solution: int, **columns: Any) -> tuple[float, str]:
    """1.0 when ``completion`` is the whole number ``solution``; else 0.0 and whether it was too low or too high."""
    text = completion.strip()
    try:
        value = int(text)
    except ValueError:
        return 0.0, "Not a whole number."
    if value == int(solution):
        return 1.0, "Correct."
    return 0.0, "Too low." if value < int(solution) else "Too high."
