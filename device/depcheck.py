"""Check, on the lent machine, that every requirement of the carried wheels and of the project is met by what this
Python sees, and fill gaps from the fallback wheels.

    python depcheck.py --site SITE --project proj/pyproject.toml [--fallback whl-fallback --fix]

``SITE`` holds the carried wheels (installed there with ``--no-deps``) and must come first on ``PYTHONPATH``, before
the machine's own site-packages. Each requirement (markers evaluated for this interpreter, requested extras
followed) is looked up among the distributions on ``sys.path``; one line per missing or refused one. With ``--fix``,
a gap that a fallback wheel fills is installed into ``SITE`` (shadowing the machine's copy) and the check runs again
in a fresh interpreter. Packages the bundle leaves out on purpose are reported as such, not as errors. Exit status 0
when nothing else is missing. Standard library and pip's vendored ``packaging`` only.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import subprocess
import sys
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - pip vendors it
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

# Not carried (size), imported by nothing the device check runs: Prefect's CLI, deployments and notification blocks,
# the Great Expectations re-check of a rejected batch (schemas/suites.py), the MCP client of env.mcp
# (envs/mcp_tools.py imports it when a run names a server) and the BM25 index of the search_qa env (built on its
# first search). PEFT is carried: the `lora` step trains adapters.
LEFT_OUT = {
    "mcp",
    "bm25s",
    "great-expectations",
    "apprise",
    "altair",
    "ruamel-yaml",
    "ruamel-yaml-clib",
    "dateparser",
    "cyclopts",
    "rich-rst",
    "docker",
    "docstring-parser",
    "marshmallow",
    "mistune",
    "tzlocal",
    "oauthlib",
    "requests-oauthlib",
    "readchar",
    "semver",
    "griffe",
    "jsonpatch",
    "python-json-logger",
    "pycparser",
}
# The machine's own large packages: reported when missing or refused, never replaced by a fallback.
MACHINE_OWN = {
    "torch",
    "transformers",
    "tokenizers",
    "accelerate",
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "matplotlib",
    "tensorboard",
    "safetensors",
    "huggingface-hub",
    "triton",
}
Problem = tuple[str, str, str, "str | None"]  # name, specifier, who asks, version found (None: missing)


def canonical(name: str) -> str:
    """A distribution name in canonical form (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def visible() -> dict[str, metadata.Distribution]:
    """The first distribution of each name on ``sys.path``: the one an import would use."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist)
    return found


def project_requirements(pyproject: Path) -> list[str]:
    """The ``[project] dependencies`` of a pyproject.toml."""
    import tomllib

    with pyproject.open("rb") as handle:
        return list(tomllib.load(handle)["project"].get("dependencies", []))


def fits(specifier: object, version: str) -> bool:
    """Whether ``version`` satisfies ``specifier`` (a version that is not PEP 440 is taken as fitting)."""
    try:
        return specifier.contains(Version(version), prereleases=True)  # type: ignore[attr-defined]
    except InvalidVersion:
        return True


def problems(site: Path, pyproject: Path | None) -> list[Problem]:
    """Every unmet requirement of the carried distributions and of the project."""
    seen = visible()
    queue = [
        (req, dist.metadata["Name"])
        for dist in metadata.distributions(path=[str(site)])
        for req in dist.requires or []
    ]
    if pyproject is not None:
        queue += [(req, "ragen-flows") for req in project_requirements(pyproject)]
    extras: dict[str, set[str]] = {}
    found: list[Problem] = []
    for text, who in queue:  # the queue grows while it is walked (requested extras)
        try:
            req = Requirement(text)
        except Exception:  # noqa: BLE001 - a malformed requirement in someone's metadata is not ours to judge
            continue
        asked = {""} | extras.get(canonical(who), set())
        if req.marker is not None and not any(req.marker.evaluate({"extra": extra}) for extra in asked):
            continue
        name = canonical(req.name)
        dist = seen.get(name)
        if dist is None:
            found.append((name, str(req.specifier) or "*", who, None))
            continue
        if req.specifier and not fits(req.specifier, dist.version):
            found.append((name, str(req.specifier), who, dist.version))
        new = set(req.extras) - extras.get(name, set())
        if new:
            extras.setdefault(name, set()).update(new)
            queue += [(sub, dist.metadata["Name"]) for sub in dist.requires or []]
    return found


def report(found: list[Problem]) -> int:
    """Print one line per problem; the number that are errors (not left out on purpose)."""
    errors = 0
    for name, spec, who, version in sorted(set(found)):
        if name in LEFT_OUT:
            kind = "left out on purpose"
        elif version is None:
            kind, errors = "MISSING", errors + 1
        else:
            kind, errors = f"VERSION {version} refused", errors + 1
        print(f"  {kind:28} {name}{'' if spec == '*' else spec}  (needed by {who})")
    return errors


def fallbacks_for(found: list[Problem], folder: Path) -> list[Path]:
    """The fallback wheels that fill gaps of ``found`` (each satisfying every specifier asked of its name)."""
    wheels = {canonical(p.name.split("-")[0]): p for p in folder.glob("*.whl")}
    chosen = set()
    for name, _, _, _ in found:
        wheel = wheels.get(name)
        if wheel is None or name in LEFT_OUT or name in MACHINE_OWN:
            continue
        version = wheel.name.split("-")[1]
        specs = [Requirement(f"x{spec}").specifier for n, spec, _, _ in found if n == name and spec != "*"]
        if all(fits(spec, version) for spec in specs):
            chosen.add(wheel)
    return sorted(chosen)


def main() -> int:
    """Check, optionally fix, check again; exit status 0 when nothing is missing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", required=True, type=Path)
    parser.add_argument("--project", type=Path)
    parser.add_argument("--fallback", type=Path)
    parser.add_argument("--fix", action="store_true")
    parser.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)  # a fallback may need a fallback
    args = parser.parse_args()
    if str(args.site.resolve()) not in {str(Path(p).resolve()) for p in sys.path if p}:
        print(f"depcheck: {args.site} is not on sys.path (put it first on PYTHONPATH)", file=sys.stderr)
        return 2
    found = problems(args.site, args.project)
    print(f"depcheck (round {args.round}): {len(found)} unmet requirement(s)")
    errors = report(found)
    if not (errors and args.fix and args.fallback):
        return 1 if errors else 0
    chosen = fallbacks_for(found, args.fallback)
    if not chosen:
        return 1
    print("depcheck: installing fallbacks:", " ".join(p.name for p in chosen))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(args.site),
            *map(str, chosen),
        ],
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    again = [sys.executable, __file__, "--site", str(args.site)]
    again += ["--project", str(args.project)] if args.project else []
    again += ["--fallback", str(args.fallback), "--fix", "--round", str(args.round + 1)] if args.round < 3 else []
    return subprocess.run(again, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
