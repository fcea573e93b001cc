import json

import pytest

from ragen_core.registry import Registry
from schemas.manifest import MANIFEST_VERSION, ManifestError, NewerManifestError, RunManifest

# a training manifest as the code wrote it before manifests were versioned (keys as stored, no manifest_version)
OLD_TRAINING = {
    "run_id": "bandit-1",
    "config": {"seed": 7, "trainer": {"iterations": 3}},
    "config_hash": "abc123",
    "seed": 7,
    "model_dir": "/models/tiny",
    "status": "interrupted",
    "interrupted_iteration": 2,
    "interrupted_stage": "update",
    "last_committed_iteration": 1,
    "resumes": [{"at": "2026-01-01T00:00:00+00:00", "pid": 12}],
    "created_at": "2026-01-01T00:00:00+00:00",
    "updated_at": "2026-01-01T00:05:00+00:00",
}


def test_a_manifest_without_a_version_is_version_1_and_reads_by_attribute():
    manifest = RunManifest.from_stored(OLD_TRAINING)
    assert manifest.manifest_version == 1
    assert (manifest.status, manifest.interrupted_iteration, manifest.last_committed_iteration) == (
        "interrupted",
        2,
        1,
    )
    assert manifest.kind == "train"  # training manifests never named their kind
    assert manifest.resumes[-1]["pid"] == 12
    assert manifest.sweep is None and manifest.error is None


def test_a_manifest_missing_keys_reads_with_the_defaults_the_readers_used():
    manifest = RunManifest.from_stored({"run_id": "bare"})
    assert (manifest.kind, manifest.status, manifest.resumes, manifest.config) == ("train", "running", [], None)


def test_what_is_stored_is_what_was_read_plus_the_version():
    """The JSON keys never change: the fields a manifest had, no default it lacked, and its version."""
    stored = RunManifest.from_stored(OLD_TRAINING).stored()
    assert stored == {**OLD_TRAINING, "manifest_version": MANIFEST_VERSION}
    assert "kind" not in stored and "sweep" not in stored


def test_unknown_keys_round_trip():
    data = {**OLD_TRAINING, "added_by_a_tool": {"note": [1, 2]}, "zeta": None}
    manifest = RunManifest.from_stored(data)
    again = RunManifest.from_stored(json.loads(json.dumps(manifest.updated(status="completed").stored())))
    assert again.stored()["added_by_a_tool"] == {"note": [1, 2]} and "zeta" in again.stored()
    assert again.status == "completed"


def test_updated_without_and_with_attempt_are_copies():
    manifest = RunManifest.from_stored(OLD_TRAINING)
    resumed = manifest.without("interrupted_iteration", "interrupted_stage").with_attempt(precision="fp32")
    assert "interrupted_iteration" not in resumed.stored() and resumed.interrupted_iteration is None
    assert resumed.resumes[-1] == {"at": "2026-01-01T00:00:00+00:00", "pid": 12, "precision": "fp32"}
    assert manifest.resumes[-1] == {"at": "2026-01-01T00:00:00+00:00", "pid": 12}  # the original is untouched
    assert RunManifest(run_id="fresh").with_attempt(precision="fp32").resumes == []  # never resumed: no entry
    with pytest.raises(ManifestError, match="has seed = '3', not an integer"):
        manifest.updated(seed="3")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"status": 5}, "has status = 5, not a text"),
        ({"seed": "3"}, "has seed = '3', not an integer"),
        ({"last_committed_iteration": True}, "has last_committed_iteration = True, not an integer"),
        ({"config": [1, 2]}, "has config = [1, 2], not a mapping"),
        ({"resumes": "twice"}, "has resumes = 'twice', not a list"),
        ({"resumes": [3]}, "has resumes[0] = 3, not a mapping"),
        ({"run_id": None}, "has run_id = None, not a text"),
        ({"manifest_version": "2"}, "has manifest_version = '2', not a version"),
        ({"manifest_version": 0}, "has manifest_version = 0, not a version"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_one_line_naming_the_field(change, expected):
    with pytest.raises(ManifestError) as caught:
        RunManifest.from_stored({**OLD_TRAINING, **change})
    assert str(caught.value) == expected or str(caught.value).startswith(expected)
    assert "\n" not in str(caught.value) and "pydantic" not in str(caught.value)


def test_not_an_object_or_no_run_id_is_refused():
    with pytest.raises(ManifestError, match="^is not a JSON object$"):
        RunManifest.from_stored([OLD_TRAINING])
    with pytest.raises(ManifestError, match="^has no run_id$"):
        RunManifest.from_stored({"status": "completed"})


def test_a_newer_manifest_says_to_upgrade():
    with pytest.raises(
        NewerManifestError, match="manifest_version 2, but this ragen-flows only knows versions up to 1"
    ):
        RunManifest.from_stored({**OLD_TRAINING, "manifest_version": MANIFEST_VERSION + 1})


def test_a_stored_version_is_brought_up_step_by_step(monkeypatch):
    """An older version runs each registered step on its way to the current one, as table upgrades do."""
    import schemas.manifest as module

    monkeypatch.setattr(module, "MANIFEST_VERSION", 3)
    steps = Registry("manifest upgrade")
    steps.add(1, lambda data: {"host" if key == "hostname" else key: v for key, v in data.items()})  # a v2 rename
    manifest = RunManifest.from_stored({"run_id": "old", "hostname": "box"}, upgrades=steps)  # 2 -> 3: added fields
    assert manifest.host == "box" and manifest.manifest_version == 3 and "hostname" not in manifest.stored()
    assert RunManifest.from_stored({"run_id": "new", "manifest_version": 2}, upgrades=steps).manifest_version == 3


def test_every_field_is_described():
    assert [name for name, field in RunManifest.model_fields.items() if not field.description] == []
