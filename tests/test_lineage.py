"""The code's lineage (ragen_core/lineage.py): the oldest fingerprint from which a chain of re-stamp records leads
to the code's own, computed on a checkout built here (a package of two modules and the records beside it)."""

from __future__ import annotations

import json
from pathlib import Path

from ragen_core.lineage import RECORDS, code_fingerprint, lineage_root


def _checkout(root: Path, body: str) -> str:
    """A checkout at ``root`` whose counted code is one module holding ``body``; its fingerprint."""
    (root / "ragen_core").mkdir(parents=True)
    (root / "ragen_core" / "env.py").write_text(body)
    (root / "ragen_core" / "api.py").write_text("X = 1\n")  # plumbing: never counted
    return code_fingerprint(root)


def _record(root: Path, old: str, new: str, date: str) -> None:
    folder = root / RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    record = {"from": {"fingerprint": old}, "to": {"fingerprint": new}, "date": date}
    (folder / f"{old}-{new}.json").write_text(json.dumps(record))


def test_code_without_records_is_its_own_lineage(tmp_path):
    here = _checkout(tmp_path, "REWARD = 1.0\n")
    assert lineage_root(tmp_path) == here


def test_a_chain_of_records_leads_back_to_the_oldest_code(tmp_path):
    here = _checkout(tmp_path, "REWARD = 1.0\n")
    other = _checkout(tmp_path / "other", "REWARD = 2.0\n")  # another code: a record about it does not count here
    _record(tmp_path, "1" * 16, "2" * 16, "2026-01-01T00:00:00Z")
    _record(tmp_path, "2" * 16, here, "2026-01-02T00:00:00Z")
    _record(tmp_path, "3" * 16, other, "2026-01-03T00:00:00Z")
    assert lineage_root(tmp_path) == "1" * 16


def test_a_cycle_of_records_ends(tmp_path):
    here = _checkout(tmp_path, "REWARD = 1.0\n")
    _record(tmp_path, here, "4" * 16, "2026-01-01T00:00:00Z")
    _record(tmp_path, "4" * 16, here, "2026-01-02T00:00:00Z")
    assert lineage_root(tmp_path) in {here, "4" * 16}
