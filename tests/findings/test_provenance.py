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
