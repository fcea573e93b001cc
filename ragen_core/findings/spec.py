"""Finding specs: which runs reproduce one of the paper's findings, as data (``configs/findings/<name>.yaml``).

A spec file is a YAML mapping with a ``finding:`` section; every other top-level key is the base config (the same
keys as any run config), or ``finding.config`` names a config file under ``configs/`` to start from instead::

    finding:
      claim: one line, what the paper says
      analysis: echo_trap           # a function of ragen_core.findings.analysis.ANALYSES
      config: configs/bandit.yaml   # optional: the base config (a path inside the repository's configs/)
      overrides: [trainer.iterations=40]
      variants: {starpo: [algorithm.preset=starpo], starpo_s: [algorithm.preset=starpo_s]}
      grid: ["algorithm.filter_ratio=[0.25,0.5]"]
      seeds: 3
      quick: {overrides: [trainer.iterations=2], seeds: 2}
      params: {collapse_drop: 0.25}
      runs_of: echo_trap            # optional: analyse another finding's runs (no runs of its own)

Each variant is its own sweep (grid x seeds, :func:`ragen_core.sweep.plan_sweep`) of the base config with the
variant's overrides applied before the config is resolved, so a variant may switch ``algorithm.preset`` (a grid
axis cannot: the sweep resolves the base first). A YAML file in the folder without a ``finding:`` section is an
ordinary config that specs may start from; it is not a finding. Names given by users are looked up among the
registered files, never used as paths.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ragen_core.config import ConfigError, RunConfig, apply_overrides
from ragen_core.policy.tiny import tiny_model_key
from ragen_core.run.checks import build_run_config
from ragen_core.storage.names import without_split_words
from ragen_core.sweep import SweepError, SweepPlan, plan_sweep, with_sweep_id

REPO_ROOT = Path(__file__).resolve().parents[2]
FINDINGS_DIR = REPO_ROOT / "configs" / "findings"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
SPEC_KEYS = {"claim", "analysis", "config", "overrides", "variants", "grid", "seeds", "quick", "params", "runs_of"}


class FindingError(ValueError):
    """A finding that cannot be run as asked: an unknown name, or a spec file that is not valid."""


@dataclass(frozen=True)
class Variant:
    """One arm of a finding: a name and the overrides that make it (applied before the config is resolved)."""

    name: str
    overrides: list[str]


@dataclass(frozen=True)
class FindingSpec:
    """A parsed spec file (see the module docstring)."""

    name: str
    claim: str
    analysis: str
    base: dict[str, Any]
    variants: list[Variant]
    grid: list[str] = field(default_factory=list)
    seeds: int | list[int] | None = None
    overrides: list[str] = field(default_factory=list)
    quick_overrides: list[str] = field(default_factory=list)
    quick_seeds: int | list[int] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    runs_of: str | None = None


@dataclass(frozen=True)
class VariantPlan:
    """A variant, the resolved base config of its sweep and the sweep's plan."""

    variant: Variant
    base: RunConfig
    plan: SweepPlan


def _read(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FindingError(f"finding file {path.name!r} cannot be read: {exc}") from None
    return loaded if isinstance(loaded, dict) else {}


def registered(folder: Path = FINDINGS_DIR) -> dict[str, Path]:
    """Registered findings: name -> spec file, for every ``<name>.yaml`` in ``folder`` with a ``finding:`` section."""
    found = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        if NAME_PATTERN.match(path.stem) and isinstance(_read(path).get("finding"), dict):
            found[path.stem] = path
    return found


def claims(folder: Path = FINDINGS_DIR) -> dict[str, str]:
    """name -> the finding's one-line claim."""
    return {name: str(_read(path)["finding"].get("claim", "")) for name, path in registered(folder).items()}


def load_finding(name: str, folder: Path = FINDINGS_DIR) -> FindingSpec:
    """The spec of the registered finding ``name``; an unknown name is an error listing the registered ones."""
    known = registered(folder)
    if name not in known:
        listing = ", ".join(known) or "none"
        raise FindingError(f"unknown finding {name!r}; registered findings: {listing} (`ragen reproduce --list`)")
    raw = _read(known[name])
    section = raw.pop("finding")
    unknown = sorted(set(section) - SPEC_KEYS)
    if unknown:
        raise FindingError(f"finding {name!r}: unknown key(s) {unknown} in its finding: section")
    from ragen_core.findings.analysis import ANALYSES

    if section.get("analysis") not in ANALYSES:
        raise FindingError(f"finding {name!r}: analysis must be one of {sorted(ANALYSES)}")
    quick = section.get("quick") or {}
    variants = section.get("variants") or {"base": []}
    return FindingSpec(
        name=name,
        claim=str(section.get("claim", "")),
        analysis=section["analysis"],
        base=_base_tree(name, section.get("config"), raw),
        variants=[Variant(str(k), [str(o) for o in v or []]) for k, v in variants.items()],
        grid=[str(g) for g in section.get("grid") or []],
        seeds=section.get("seeds"),
        overrides=[str(o) for o in section.get("overrides") or []],
        quick_overrides=[str(o) for o in quick.get("overrides") or []],
        quick_seeds=quick.get("seeds", section.get("seeds")),
        params=dict(section.get("params") or {}),
        runs_of=section.get("runs_of"),
    )


def _base_tree(name: str, config: str | None, rest: dict[str, Any]) -> dict[str, Any]:
    """The base config tree: the named file under configs/ (then no other top-level keys), else the file's own."""
    if config is None:
        return rest
    path = (REPO_ROOT / config).resolve()
    if not path.is_relative_to(REPO_ROOT / "configs") or not path.is_file():
        raise FindingError(f"finding {name!r}: config {config!r} must be a file under configs/")
    if rest:
        raise FindingError(f"finding {name!r}: give either finding.config or the config keys, not both")
    return _read(path)


def run_spec(spec: FindingSpec, folder: Path = FINDINGS_DIR) -> FindingSpec:
    """The spec whose runs ``spec`` analyses: its own, or those of ``runs_of``."""
    if spec.runs_of is None:
        return spec
    if spec.runs_of == spec.name:
        raise FindingError(f"finding {spec.name!r}: runs_of names itself")
    return load_finding(spec.runs_of, folder)


def _sweep_hash(sweep_id: str, fingerprint: str) -> str:
    """8 hex digits of the sweep's own id (its resolved base config, grid and seeds) and the code fingerprint."""
    return hashlib.sha256(f"{sweep_id}/{fingerprint}".encode()).hexdigest()[:8]


def plan_finding(spec: FindingSpec, quick: bool = False, fingerprint: str | None = None) -> list[VariantPlan]:
    """One sweep per variant (validated, nothing run). Sweep ids are ``<name>[-quick]-<variant>-<hash>`` with the
    hash of the sweep's spec and of the code that runs it (:func:`_sweep_hash`), so the same finding under the same
    code names the same runs (and resumes them), and a changed spec or changed code makes new runs: a finding is
    never analysed over runs that other code made. ``fingerprint`` names other code than the checkout's (the runs
    that a re-stamped finding's JSON names)."""
    from ragen_core.findings.provenance import code_fingerprint

    code = fingerprint or code_fingerprint(REPO_ROOT)
    plans = []
    for variant in spec.variants:
        try:
            tree = apply_overrides(spec.base, spec.overrides)
            tree = apply_overrides(tree, variant.overrides)
            if quick:
                tree = apply_overrides(tree, spec.quick_overrides)
            resolved = build_run_config(tree)  # validated once: the sweep's points are validated from it, once each
            seeds = spec.quick_seeds if quick else spec.seeds
            draft = plan_sweep(resolved, spec.grid, seeds=seeds)
            prefix = without_split_words(f"{spec.name}{'-quick' if quick else ''}-{variant.name}".replace("_", "-"))
            plan = with_sweep_id(draft, f"{prefix}-{_sweep_hash(draft.sweep_id, code)}")
            plans.append(VariantPlan(variant, resolved, plan))
        except (ConfigError, SweepError) as exc:
            raise FindingError(f"finding {spec.name!r}, variant {variant.name!r}: {exc}") from None
    return plans


def model_key(config: RunConfig) -> str:
    """What model a run starts from: the folder ``model.path`` names, else the tiny default's key (its shape, its
    tokenizer's corpus)."""
    return config.model.path or tiny_model_key(config.model.tiny)


def spec_digest(spec: FindingSpec, root: Path = REPO_ROOT, fingerprint: str | None = None) -> str:
    """A short hash of everything that decides the finding's runs and numbers: its spec, the resolved config of every
    run it makes (each point's config hash: the defaults included), the model each starts from, and the code that
    computes them (:func:`ragen_core.findings.provenance.code_fingerprint`). A finding whose committed digest differs
    from the one the current checkout computes was made by other code or another spec: it is out of date.
    ``fingerprint`` stands for the code in place of the checkout's (the digest that a finding made by that code has:
    the checkout's specs and configs still give it when only the code changed, :mod:`ragen_core.findings.restamp`)."""
    from ragen_core.findings.provenance import code_fingerprint

    code = fingerprint or code_fingerprint(root)
    runs = run_spec(spec)
    plans = plan_finding(runs, fingerprint=code)
    payload = {
        "spec": {
            "base": spec.base,
            "variants": [v.__dict__ for v in spec.variants],
            "grid": spec.grid,
            "seeds": spec.seeds,
            "overrides": spec.overrides,
            "params": spec.params,
            "analysis": spec.analysis,
            "runs_of": spec.runs_of,
        },
        "runs": {item.variant.name: [[p.run_id, p.config.config_hash()] for p in item.plan.points] for item in plans},
        "models": sorted({model_key(p.config) for item in plans for p in item.plan.points}),
        "code": code,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


__all__ = [
    "FINDINGS_DIR",
    "FindingError",
    "FindingSpec",
    "Variant",
    "VariantPlan",
    "claims",
    "load_finding",
    "model_key",
    "plan_finding",
    "registered",
    "run_spec",
    "spec_digest",
]
