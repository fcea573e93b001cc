"""The committed findings hold for this checkout's code and specs: each ``docs/findings/NAME.json``'s
``spec_digest`` is the digest the checkout computes for NAME under the fingerprint of the code that made it (its
spec, the resolved config of every run, the models), and that code is the checkout's, or is linked to it by a chain of
re-stamp records (``docs/findings/restamps/``: ``ragen reproduce --restamp`` proved that the change moved none of the
numbers). A change to an env, a prompt, a loss or the sampler fails here until a re-stamp vouches for it or ``ragen
reproduce --all`` has written the findings again; a change to a default or a finding's spec only the latter."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ragen_core.findings.provenance import code_fingerprint
from ragen_core.findings.restamp import reaches, records
from ragen_core.findings.spec import REPO_ROOT, load_finding, registered, spec_digest

FOLDER = REPO_ROOT / "docs" / "findings"
HOW = "re-stamp it (ragen reproduce --restamp) or regenerate it: ragen reproduce --all --out-dir docs/findings"


def test_every_registered_finding_has_its_committed_json_and_picture():
    names = sorted(registered())
    assert names, "no findings registered"
    assert sorted(path.stem for path in FOLDER.glob("*.json")) == names
    assert all((FOLDER / f"{name}.png").is_file() for name in names)


@pytest.mark.parametrize("name", sorted(registered()))
def test_a_committed_finding_was_made_by_this_checkout_s_code_and_spec(name):
    made = json.loads((FOLDER / f"{name}.json").read_text())
    here, code = code_fingerprint(REPO_ROOT), made["code"]["fingerprint"]
    chain = reaches(code, here, REPO_ROOT)
    assert chain is not None, f"{name}: made by other code ({code}) that no re-stamp links to this ({here}); {HOW}"
    assert all(name in record["findings"] for record in chain), f"{name}: a re-stamp on its path did not probe it"
    digest = spec_digest(load_finding(name), fingerprint=code)
    assert made["spec_digest"] == digest, f"{name}: made by another spec, config or default; {HOW}"
    assert made["code"]["dirty"] is False  # from a committed tree


def _registered_at(commit: str) -> set[str]:
    """The findings whose spec the commit holds (``configs/findings/<name>.yaml``), among those registered now."""
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", commit, "configs/findings/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {Path(p).stem for p in listed} & set(registered())


def test_every_re_stamp_record_vouches_for_a_whole_passed_probe_on_one_machine():
    """A record links two fingerprints only as a probe of every finding its old commit registered (those the new
    commit adds were run on its side only, named as new) that ran each changed counted file, within the 40 minutes
    a re-stamp is meant to take on 2 cores; its sides ran one after the other on one machine (one CPU named)."""
    for record in records(REPO_ROOT):
        where = f"{record['from']['fingerprint']}-{record['to']['fingerprint']}"
        assert record["from"]["fingerprint"] != record["to"]["fingerprint"], where
        registered_then = _registered_at(record["from"]["commit"])
        assert set(record["findings"]) == registered_then, where
        assert set(record.get("new_findings", [])) == _registered_at(record["to"]["commit"]) - registered_then, where
        assert record["changed_files"] and all(record["points"].values()), where
        assert record["rows"]["trajectories"] > 0 and record["rows"]["metrics"] > 0, where
        assert record["seconds"]["total"] <= 40 * 60, where
        assert record["cpu"]["model"] and record["cpu"]["torch_capability"], where


# Envs whose first observation is not the whole instance: sql_agent shows the question, not the tables it asks about,
# so a validation question's words may have been met in training over other tables ("How many staff joined in or
# after 2009?"); its instances are held out by question and rows (tests/envs/test_sql_agent.py), and the overlap of its
# first observations is reported, not zero (docs/findings.md, "Agents that use tools")
QUESTION_ONLY = {"sql_agent"}


def test_held_out_validation_met_no_training_map():
    """Every arm of a finding on a map env validated on maps its run never trained on (nor its bootstrap)."""
    checked = 0
    for path in sorted(FOLDER.glob("*.json")):
        for arm, overlap in (json.loads(path.read_text()).get("held_out") or {}).items():
            checked += 1
            assert overlap["held_out"] == "maps", f"{path.stem} {arm}: {overlap}"
            if arm.split(" / ")[-1] not in QUESTION_ONLY:
                assert overlap["val_seen_in_training"]["max"] == 0.0, f"{path.stem} {arm}: {overlap}"
    assert checked
