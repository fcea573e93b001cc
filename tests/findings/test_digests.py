"""The committed findings were made by the code and the specs of this checkout: each ``docs/findings/NAME.json``'s
``spec_digest`` is the digest the checkout computes for NAME (its spec, the resolved config of every run, the models
and the code fingerprint), and its ``code.fingerprint`` is the checkout's. A change to an env, a prompt, a loss, a
default or a finding's spec fails here until ``ragen reproduce --all`` has written the findings again."""

from __future__ import annotations

import json

import pytest

from ragen_core.findings.provenance import code_fingerprint
from ragen_core.findings.spec import REPO_ROOT, load_finding, registered, spec_digest

FOLDER = REPO_ROOT / "docs" / "findings"
HOW = "regenerate it: ragen reproduce --all --out-dir docs/findings (docs/findings.md)"


def test_every_registered_finding_has_its_committed_json_and_picture():
    names = sorted(registered())
    assert names, "no findings registered"
    assert sorted(path.stem for path in FOLDER.glob("*.json")) == names
    assert all((FOLDER / f"{name}.png").is_file() for name in names)


@pytest.mark.parametrize("name", sorted(registered()))
def test_a_committed_finding_was_made_by_this_checkout_s_code_and_spec(name):
    made = json.loads((FOLDER / f"{name}.json").read_text())
    assert made["code"]["fingerprint"] == code_fingerprint(REPO_ROOT), f"{name}: made by other code; {HOW}"
    assert made["spec_digest"] == spec_digest(load_finding(name)), f"{name}: made by another spec or config; {HOW}"
    assert made["code"]["dirty"] is False  # from a committed tree


def test_held_out_validation_met_no_training_map():
    """Every arm of a finding on a map env validated on maps its run never trained on (nor its bootstrap)."""
    checked = 0
    for path in sorted(FOLDER.glob("*.json")):
        for arm, overlap in (json.loads(path.read_text()).get("held_out") or {}).items():
            checked += 1
            assert overlap["held_out"] == "maps", f"{path.stem} {arm}: {overlap}"
            assert overlap["val_seen_in_training"]["max"] == 0.0, f"{path.stem} {arm}: {overlap}"
    assert checked
