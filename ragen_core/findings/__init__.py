"""The paper's findings as data: specs (:mod:`.spec`), their analyses over the lake (:mod:`.analysis`,
:mod:`.studies`) and their pictures (:mod:`.figures`). Run them with ``ragen reproduce NAME``."""

from ragen_core.findings import lora as _lora  # noqa: F401  (registers the analyses they define)
from ragen_core.findings import multiturn as _multiturn  # noqa: F401
from ragen_core.findings import studies as _studies  # noqa: F401
from ragen_core.findings import tool_use as _tool_use  # noqa: F401
from ragen_core.findings.analysis import ANALYSES, Context, load_context, spread
from ragen_core.findings.spec import (
    FINDINGS_DIR,
    FindingError,
    FindingSpec,
    VariantPlan,
    claims,
    load_finding,
    plan_finding,
    registered,
    run_spec,
)

__all__ = [
    "ANALYSES",
    "FINDINGS_DIR",
    "Context",
    "FindingError",
    "FindingSpec",
    "VariantPlan",
    "claims",
    "load_context",
    "load_finding",
    "plan_finding",
    "registered",
    "run_spec",
    "spread",
]
