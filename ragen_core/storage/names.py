"""Run ids are names: never patterns, paths or SQL text.

A run id names folders under the data root (``runs/<id>/``, ``<table>/run-<id>/``, ``_commits/<id>/`` ...) and
the rows of the run in every table, so one validator decides what a run id may be, and every entry point (the CLI
commands, the flows' parameters, the lake's path helpers as a backstop) applies it before anything is created:

- 1 to :data:`RUN_ID_MAX_LENGTH` characters, each an ASCII letter, a digit, ``.``, ``_`` or ``-``;
- the first one a letter, a digit or ``_``: a leading ``.`` would hide the folders (and allow ``.`` and ``..``),
  a leading ``-`` reads as an option on the command line.

With these rules a run id holds no glob character (``*?[``), no path separator and no quote, so a listing built
from it matches that run only and it never leaves the data root; SQL still takes it as a parameter, never as text.
128 characters leave room for derived ids (``<sweep id>-p<NNN>``) well under file systems' 255-byte name limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragen_core.storage.files import LakeError

RUN_ID_MAX_LENGTH = 128
_ALLOWED = re.compile(r"[A-Za-z0-9._-]")
_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
RUN_ID_RULE = (
    f"use 1 to {RUN_ID_MAX_LENGTH} characters: letters, digits, '.', '_' or '-', starting with a letter, digit or '_'"
    " (e.g. sokoban-lr3e-6_seed.1)"
)


class InvalidRunIdError(LakeError, ValueError):
    """A run id (or a sweep id, which prefixes run ids) that is not a plain name; the message says why and how."""


def _problem(run_id: str) -> str:
    """What is wrong with a string that is not a valid run id."""
    if not run_id:
        return "is empty"
    if len(run_id) > RUN_ID_MAX_LENGTH:
        return f"is {len(run_id)} characters long (at most {RUN_ID_MAX_LENGTH})"
    bad = sorted({c for c in run_id if not _ALLOWED.fullmatch(c)})
    if bad:
        return "contains " + ", ".join(repr(c) for c in bad[:8])
    return f"starts with {run_id[0]!r}"


def is_valid_run_id(run_id: object) -> bool:
    """Whether ``run_id`` is a string that :func:`validate_run_id` accepts."""
    return isinstance(run_id, str) and len(run_id) <= RUN_ID_MAX_LENGTH and _RUN_ID.fullmatch(run_id) is not None


def validate_run_id(run_id: object, what: str = "run id") -> str:
    """``run_id`` itself when it is a valid name (module docstring), else :class:`InvalidRunIdError` saying what is
    wrong (``what`` names the value in the message, e.g. ``"sweep id"``)."""
    if not isinstance(run_id, str):
        raise InvalidRunIdError(f"{what} must be a string, not {type(run_id).__name__}")
    if not is_valid_run_id(run_id):
        shown = repr(run_id) if len(run_id) <= 80 else repr(run_id[:60]) + "..."
        raise InvalidRunIdError(f"{what} {shown} {_problem(run_id)}; {RUN_ID_RULE}")
    return run_id


# Hugging Face ``datasets`` (``load_dataset("parquet", data_dir=...)``) makes a split of every folder or file whose
# name holds one of these words between two of its separators (or the name's start or end), case-sensitively:
# ``datasets.data_files.SPLIT_KEYWORDS`` and ``NON_WORDS_CHARS`` (tests/storage/test_split_words.py holds this copy
# to them). A run id names a folder in every table, so the ids the project derives never hold one.
SPLIT_WORDS: dict[str, str] = {  # each word and what a derived id writes instead (no split word, nor a new one)
    "training": "trng",
    "train": "trn",
    "validation": "vldn",
    "valid": "vld",
    "dev": "dv",
    "val": "vl",
    "testing": "tstg",
    "test": "tst",
    "evaluation": "evln",
    "eval": "evl",
}
SPLIT_SEPARATORS = "-._ 0123456789"
_SPLIT_WORD = re.compile(r"(?<![^-._ 0-9])(" + "|".join(SPLIT_WORDS) + r")(?![^-._ 0-9])")


def split_word_in(name: str) -> str | None:
    """The first split word of Hugging Face ``datasets`` that ``name`` (a folder or file name) holds between
    separators, None when it holds none (:data:`SPLIT_WORDS`)."""
    match = _SPLIT_WORD.search(name)
    return match.group(1) if match else None


def without_split_words(text: str) -> str:
    """``text`` with every split word of Hugging Face ``datasets`` it holds between separators written short
    (``bandit_test`` -> ``bandit_tst``): for the parts of the run ids the project derives from names (an env, a
    model folder), so no derived id makes ``load_dataset(..., data_dir=<table folder>)`` take a run for a split."""
    return _SPLIT_WORD.sub(lambda match: SPLIT_WORDS[match.group(1)], text)


RUN_REF_PREFIX = "run:"


class RunRefError(ValueError):
    """A ``[run:]<run id>[@<updates>]`` reference that is not well formed; the message says what to write."""


@dataclass(frozen=True)
class RunRef:
    """A run named by ``[run:]<run id>[@<updates>]``: the run, and its checkpoint after ``updates`` updates (None:
    no ``@``); ``prefixed`` when it was written with ``run:``."""

    run_id: str
    updates: int | None
    prefixed: bool


def split_run_ref(text: str) -> tuple[str, str | None]:
    """``(run id part, updates part or None)`` of ``[run:]<run id>[@<updates>]``, unchecked: the one place that
    splits such a reference (:func:`parse_run_ref` checks both parts)."""
    run_id, at, updates = text.removeprefix(RUN_REF_PREFIX).partition("@")
    return run_id, updates if at else None


def parse_run_ref(text: str) -> RunRef:
    """The :class:`RunRef` written as ``text``; :class:`RunRefError` when the run id is not a valid one or what
    follows ``@`` is not a plain number of updates."""
    run_id, updates = split_run_ref(text)
    prefixed = text.startswith(RUN_REF_PREFIX)
    if not is_valid_run_id(run_id):
        raise RunRefError(f"{run_id!r} is not a run id (letters, digits, '.', '_', '-')")
    if updates is not None and not (updates.isascii() and updates.isdigit()):
        example = f"{RUN_REF_PREFIX if prefixed else ''}{run_id}@10"
        raise RunRefError(f"after '@' give the number of updates, e.g. {example}")
    return RunRef(run_id, int(updates) if updates is not None else None, prefixed)
