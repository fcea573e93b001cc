"""A finding's JSON records the code and library versions that made it (ragen_core.findings.provenance)."""

import subprocess
from importlib import metadata

from ragen_core.findings.provenance import DISTRIBUTIONS, code_version, library_versions


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_the_commit_and_whether_tracked_files_changed(tmp_path):
    assert code_version(tmp_path) == {"commit": None, "dirty": None}  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert code_version(tmp_path) == {"commit": head.strip(), "dirty": False}
    (tmp_path / "untracked.txt").write_text("data\n")  # an untracked file is no change of the code
    assert code_version(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == {"commit": head.strip(), "dirty": True}


def test_the_library_versions_are_the_installed_ones():
    versions = library_versions()
    assert set(versions) == {"python", *DISTRIBUTIONS}
    assert versions["torch"] == metadata.version("torch") and versions["duckdb"] == metadata.version("duckdb")


def _copy_core(tmp_path):
    import shutil

    from ragen_core.findings.spec import REPO_ROOT

    root = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / "ragen_core", root / "ragen_core", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_the_code_fingerprint_follows_the_code_that_decides_numbers_and_not_the_plumbing(tmp_path):
    from ragen_core.findings.provenance import code_fingerprint
    from ragen_core.findings.spec import REPO_ROOT, load_finding, spec_digest

    root = _copy_core(tmp_path)
    before = code_fingerprint(root)
    assert before == code_fingerprint(REPO_ROOT)  # bytes and paths only: the copy is the same code
    spec = load_finding("echo_trap")
    digest = spec_digest(spec, root)
    storage = root / "ragen_core" / "storage" / "lake.py"
    storage.write_text(storage.read_text() + "\n# a comment in the lake\n")
    assert code_fingerprint(root) == before and spec_digest(spec, root) == digest
    env = root / "ragen_core" / "envs" / "bandit.py"
    env.write_text(env.read_text() + "\n# a comment in an env\n")
    assert code_fingerprint(root) != before and spec_digest(spec, root) != digest
    (root / "ragen_core" / "envs" / "new_env.py").write_text("X = 1\n")  # a new module counts unless listed
    changed = code_fingerprint(root)
    (root / "ragen_core" / "envs" / "new_env.py").unlink()
    assert changed != code_fingerprint(root)


def test_a_finding_digest_covers_its_resolved_configs_and_models(tmp_path):
    from dataclasses import replace

    from ragen_core.findings.spec import load_finding, spec_digest

    spec = load_finding("filtering")
    digest = spec_digest(spec)
    assert spec_digest(replace(spec, seeds=3)) != digest
    assert spec_digest(replace(spec, overrides=[*spec.overrides, "model.tiny.seed=1"])) != digest  # another model
    assert spec_digest(replace(spec, params={**spec.params, "x": 1})) != digest  # what the analysis is told
    assert spec_digest(load_finding("filtering")) == digest
