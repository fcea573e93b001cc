"""A finding's JSON records the code and library versions that made it (ragen_core.findings.provenance)."""

import subprocess
from importlib import metadata

import pytest

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
    source = env.read_text()
    env.write_text(source + "\n# a comment in an env\n")  # words about the code are not the code
    assert code_fingerprint(root) == before and spec_digest(spec, root) == digest
    env.write_text(source + "\nNUMBER = 1\n")  # code
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


SOURCE = '''"""A module."""

import math

LIMIT = 3  # a comment


class Env:
    """An env."""

    def step(self, action: int) -> float:
        """One step."""
        return math.sqrt(action) * LIMIT


def only_documented() -> None:
    """Nothing else."""
'''


@pytest.mark.parametrize(
    ("edit", "same"),
    [
        (lambda s: s.replace('"""One step."""', '"""One step of the env, longer."""'), True),  # a docstring
        (lambda s: s.replace("# a comment", "# another comment"), True),  # a comment
        (lambda s: s.replace("LIMIT = 3  # a comment", "\n\nLIMIT = 3   "), True),  # blank lines, trailing blanks
        (lambda s: s.replace("LIMIT = 3  # a comment", "LIMIT = (\n    3\n)"), False),  # the code's own layout
        (lambda s: s.replace('"""A module."""\n', ""), True),  # a docstring gone
        (lambda s: s.replace("LIMIT = 3", "LIMIT = 4"), False),  # a constant
        (lambda s: s.replace("math.sqrt(action)", "math.sqrt(action + 1)"), False),  # an expression
        (lambda s: s.replace("import math", "import math as m").replace("math.sqrt", "m.sqrt"), False),  # a name
        (lambda s: s + "\nNOTE = 'a string that is no docstring'\n", False),  # a string the code holds
    ],
)
def test_the_code_form_keeps_the_code_and_drops_the_words_about_it(edit, same):
    from ragen_core.findings.provenance import code_form

    edited = edit(SOURCE)
    assert edited != SOURCE  # the edit applies
    assert (code_form(edited) == code_form(SOURCE)) is same


def test_the_code_form_of_a_line_with_wide_characters_cuts_only_the_docstring():
    """The syntax tree counts columns in UTF-8 bytes, the source in characters: a docstring after wide characters
    on its line, and code after it, are cut where they are."""
    from ragen_core.findings.provenance import code_form

    source = 'def f():\n    """ünïcödé → docstring"""; return "≥ kept"  # gone\n'
    form = code_form(source).splitlines()
    assert form[0] == "def f():" and form[1].strip() == '; return "≥ kept"' and len(form) == 2


def test_every_module_of_the_core_has_a_code_form():
    from ragen_core.findings.provenance import code_form
    from ragen_core.findings.spec import REPO_ROOT

    for path in sorted((REPO_ROOT / "ragen_core").rglob("*.py")):
        form = code_form(path.read_text())
        assert '"""' not in form.split("\n", 1)[0], path  # no module docstring left at the top
