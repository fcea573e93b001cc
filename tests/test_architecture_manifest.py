"""The run manifest is read by attribute (docs/architecture.md, "The rooms"), checked on the source (parsed, never
imported): outside ``schemas/manifest.py``, which declares :class:`~schemas.manifest.RunManifest`, no module reads
or writes a manifest's key by its string (``manifest["status"]``, ``manifest.get("model_dir")``, ``"error" in
manifest``, ``{**manifest, "status": ...}``), so a field is named once, typed and documented, and a renamed one
fails where it is read instead of reading ``None``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_architecture import ROOT, _modules, _tree

MANIFEST_MODULE = ROOT / "schemas" / "manifest.py"
# calls that hand out a manifest: a name bound to one of them holds a manifest, whatever it is called
SOURCES = {"read_manifest", "new_manifest", "resumed_manifest", "check_manifest", "from_stored", "RunManifest"}
DICT_METHODS = {"get", "pop", "setdefault"}


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _bound_manifests(tree: ast.Module) -> set[str]:
    """Names assigned from a call that hands out a manifest (``m = lake.read_manifest(run_id)``)."""
    return {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _called(node.value) in SOURCES
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _is_manifest(node: ast.AST, bound: set[str]) -> bool:
    """Whether ``node`` is (or may be) a manifest: a name or attribute that says so (``manifest``,
    ``record.manifest``), a name bound to a manifest, a call that hands one out or a method call on one, or
    ``manifest or {}``."""
    if isinstance(node, ast.Name):
        return node.id in bound or "manifest" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "manifest" in node.attr.lower()
    if isinstance(node, ast.Call):
        method_of = isinstance(node.func, ast.Attribute) and _is_manifest(node.func.value, bound)
        return _called(node) in SOURCES or method_of
    if isinstance(node, ast.BoolOp):
        return any(_is_manifest(value, bound) for value in node.values)
    return False


def _text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def manifest_key_reads(tree: ast.Module) -> list[str]:
    """``line N: <code>`` of every manifest key named by its string in ``tree``."""
    bound, found = _bound_manifests(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            hit = _text(node.slice) and _is_manifest(node.value, bound)
        elif isinstance(node, ast.Call):
            func = node.func
            hit = (
                isinstance(func, ast.Attribute)
                and func.attr in DICT_METHODS
                and _is_manifest(func.value, bound)
                and bool(node.args)
                and _text(node.args[0])
            )
        elif isinstance(node, ast.Compare):
            hit = _text(node.left) and any(
                isinstance(op, (ast.In, ast.NotIn)) and _is_manifest(right, bound)
                for op, right in zip(node.ops, node.comparators, strict=True)
            )
        elif isinstance(node, ast.Dict):
            unpacked = [value for key, value in zip(node.keys, node.values, strict=True) if key is None]
            hit = any(_is_manifest(value, bound) for value in unpacked)
        else:
            hit = False
        if hit:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _offenders(paths: list[Path]) -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), o) for p in paths if p != MANIFEST_MODULE for o in manifest_key_reads(_tree(p))]


def test_no_module_reads_a_manifest_key_by_its_string():
    assert _offenders(_modules("ragen_core", "flows", "ragen_cli", "tasks", "schemas", "benchmarks", "device")) == []


PLANTED = """
def f(lake, record, run_id, row):
    manifest = lake.read_manifest(run_id)
    a = manifest["status"]
    b = manifest.get("model_dir")
    m = lake.read_manifest(run_id)
    c = m["kind"]
    d = record.manifest.get("resumes", [])
    e = (lake.read_manifest(run_id) or {}).get("config")
    f = "error" in manifest
    g = {**manifest, "status": "deleting"}
    h = manifest.stored()["seed"]
    record.manifest["resumes"][-1].update({})
    ok = (manifest.status, manifest.resumes[-1]["pid"], (manifest.sweep or {}).get("id"), row["status"])
    ok = (manifest.updated(status="completed"), m.without("error"), {**row, "status": "broken"}, manifests[0])
"""


def test_the_manifest_check_sees_keys_read_by_their_string():
    """The check catches each planted form (a check that cannot fail proves nothing) and passes reads by attribute,
    the keys of a manifest's own mappings (a resume attempt, the sweep) and other dicts."""
    assert [line.split(":", 1)[0] for line in manifest_key_reads(ast.parse(PLANTED))] == [
        f"line {n}" for n in (4, 5, 7, 8, 9, 10, 11, 12, 13)
    ]
