"""The re-stamp records under ``docs/findings/restamps/``: where one is written, reading them, and the chain of
records that links the fingerprint of the code that made a finding's numbers to the checkout's
(:mod:`ragen_core.findings.restamp` writes them; ``tests/findings/test_digests.py`` follows them). Plumbing: nothing
here decides a number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragen_core.lineage import RECORDS, reaches, records


def record_path(repo: Path, record: dict[str, Any]) -> Path:
    """Where ``record`` is written: ``<old fingerprint>-<new fingerprint>.json`` under :data:`RECORDS`."""
    return repo / RECORDS / f"{record['from']['fingerprint']}-{record['to']['fingerprint']}.json"


def stamped_commit(repo: Path, fingerprint: str, start_commit: str) -> str:
    """The newest commit vouched for from ``fingerprint`` (the findings' own commit ``start_commit`` when no record
    leads on from it): where the next probe starts."""
    newest = {r["from"]["fingerprint"]: r["to"] for r in records(repo)}  # oldest first: the newest record wins
    commit, here, seen = start_commit, fingerprint, {fingerprint}
    while here in newest and newest[here]["fingerprint"] not in seen:
        commit, here = newest[here]["commit"], newest[here]["fingerprint"]
        seen.add(here)
    return commit


__all__ = ["RECORDS", "reaches", "record_path", "records", "stamped_commit"]
