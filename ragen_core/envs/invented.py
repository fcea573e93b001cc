"""Invented names for the generated tool tasks (``sql_agent``, ``search_qa``): words made of syllables drawn from a
seed, so that no fact about them is in any model's pretraining and a task is solved only by its tools."""

from __future__ import annotations

import numpy as np

ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr", "qu")
VOWELS = ("a", "e", "i", "o", "u", "ae", "io", "ou")
CODAS = ("", "", "l", "n", "r", "s", "x", "th", "nd", "rk")


def invented_word(rng: np.random.Generator, syllables: int = 2) -> str:
    """A capitalised word of ``syllables`` onset-vowel syllables and a closing consonant group."""
    parts = [ONSETS[int(rng.integers(len(ONSETS)))] + VOWELS[int(rng.integers(len(VOWELS)))] for _ in range(syllables)]
    return ("".join(parts) + CODAS[int(rng.integers(len(CODAS)))]).capitalize()


def invented_words(
    rng: np.random.Generator, count: int, syllables: int = 2, taken: set[str] | None = None
) -> list[str]:
    """``count`` distinct invented words, none of them in ``taken`` (which gains them); a ValueError of one line when
    the syllables cannot make that many."""
    taken = set() if taken is None else taken
    words: list[str] = []
    for _ in range(count * 50):
        if len(words) == count:
            break
        word = invented_word(rng, syllables)
        if word not in taken:
            taken.add(word)
            words.append(word)
    if len(words) < count:
        raise ValueError(f"cannot invent {count} distinct words of {syllables} syllable(s); ask for fewer")
    return words
