"""The run manifest (``runs/<run_id>/manifest.json``): one typed record per run, versioned like the tables.

Every field the project writes is declared here, with its type and its meaning; the JSON keys are the field names,
unchanged since manifests were plain dicts, so older data roots and the ``runs`` table read the same. A field a run
never set is not written (a training manifest names no ``kind``; a bootstrap's has no ``seed``), and keys this code
does not know are kept as they are (``extra="allow"``), so nothing stored is lost when a manifest is rewritten.

Versions: a manifest stores its ``manifest_version``; one without it predates versioning and counts as version 1.
A reader brings a version-``v`` manifest up to :data:`MANIFEST_VERSION` one step at a time, running the function
registered for ``v -> v+1`` in :data:`MANIFEST_UPGRADES` where a change needs one (renames; an added optional field
needs none). A manifest newer than this code raises :class:`NewerManifestError`. A change of the format bumps
:data:`MANIFEST_VERSION` and, for more than added fields, registers its step.

Types are checked strictly, as the JSON holds them (``"3"`` is not an integer, ``true`` is not one either): a
manifest of the wrong shape raises :class:`ManifestError` with one line naming the field, which the lake turns into
its error naming the file (:func:`ragen_core.storage.trust.check_manifest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ragen_core.registry import Registry

MANIFEST_VERSION = 1
"""The manifest format this code writes; a stored manifest without ``manifest_version`` is version 1."""

ManifestUpgrade = Callable[[dict[str, Any]], dict[str, Any]]
MANIFEST_UPGRADES: Registry[ManifestUpgrade] = Registry("manifest upgrade")
"""Functions turning a stored version-``v`` manifest (its JSON object) into a version-``v+1`` one, named ``v``."""


class ManifestError(ValueError):
    """A stored manifest is not a run manifest (a field of the wrong type, no ``run_id``): the message says which."""


class NewerManifestError(ManifestError):
    """A stored manifest was written by a newer ragen-flows than the one reading it."""


def _field(description: str, default: Any = None) -> Any:
    return Field(default, description=description)


class RunManifest(BaseModel):
    """A run's manifest: what it is, what it ran with, where it ran, its status and where it stopped."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    manifest_version: int = _field("Format of this manifest (:data:`MANIFEST_VERSION` as written).", MANIFEST_VERSION)
    run_id: str = Field(description="The run's id: the name of its folder under runs/.")
    kind: str = _field(
        "'train' (a StarPO run: its manifest names no kind), 'bootstrap' (scripted demonstrations + SFT), 'offline' "
        "(`ragen retrain`) or 'evaluation' (`ragen eval`).",
        "train",
    )
    status: str = _field(
        "'running' (also the reading of a manifest that names none), 'completed', 'failed', 'interrupted' (Ctrl-C or "
        "SIGTERM: `ragen resume` continues it) or 'deleting' (while `ragen runs rm` removes it).",
        "running",
    )
    config: dict[str, Any] | None = _field("The run's resolved config tree (RunConfig.to_dict()).")
    config_hash: str | None = _field("Hash of that config (RunConfig.config_hash()).")
    seed: int | None = _field("The run's seed (config.seed); bootstrap manifests name none.")
    model_dir: str | None = _field(
        "Model folder the run starts from (a bootstrap: the folder it builds); null in the manifest a run writes "
        "before its first session (`ragen resume` then starts it over). A folder inside the data root is stored "
        "relative to it and read back under the root the lake is opened at (ragen_core.storage.relocation)."
    )
    base_model: str | None = _field("A bootstrap's: the model folder its SFT started from.")
    tokenizer_fingerprint: str | None = _field(
        "Fingerprint of the model's tokenizer: offline re-training refuses rows written with another."
    )
    versions: dict[str, Any] | None = _field("Versions of the libraries that decide the run's numbers, by package.")
    code_sources: dict[str, Any] | None = _field(
        "Where the env and reward code the config names comes from: {name: {import_path, distribution, version}}."
    )
    git_commit: str | None = _field("Commit of the code that ran (+dirty with local changes); null outside git.")
    host: str | None = _field("Host the run started on.")
    platform: str | None = _field("platform.platform() of that host.")
    user: str | None = _field("User who started the run.")
    pid: int | None = _field("Process id of the run's process (the last attempt's: a resume writes its own).")
    command: list[str] | None = _field("Command line that started the run.")
    precision: str | None = _field("Precision the engines run in (fp32, bf16, fp16), resolved from trainer.precision.")
    update_group: dict[str, Any] | None = _field(
        "The launched group of engine processes (launcher, nproc, ...); absent when the engines run in-process."
    )
    created_at: str | None = _field("When the run was created (ISO 8601, UTC).")
    started_at: str | None = _field("When the run's first attempt started (ISO 8601, UTC).")
    updated_at: str | None = _field("Last write of the manifest (ISO 8601, UTC).")
    resumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="One entry per resume or extension, in order: at, host, pid, command, precision, update_group, "
        "and what it restored (checkpoint, checkpoint_updates, replayed, next_iteration, reused_stages, "
        "extended_from).",
    )
    error: str | None = _field("A failed run's error ('Type: message').")
    failed_iteration: int | None = _field("Iteration a failed run stopped in.")
    failed_stage: str | None = _field("Stage a failed run stopped in (an IterationStage name).")
    interrupted_iteration: int | None = _field("Iteration an interrupted run stopped in.")
    interrupted_stage: str | None = _field("Stage an interrupted run stopped in (an IterationStage name).")
    last_committed_iteration: int | None = _field("Highest committed iteration; null before any.")
    early_stop: dict[str, Any] | None = _field(
        "A training run stopped early: {iteration, reason, steps} (algorithm.filter_empty_stop_steps)."
    )
    bootstrap: dict[str, Any] | None = _field("A training run's bootstrap summary (trainer.bootstrap); null without.")
    summary: dict[str, Any] | None = _field("A bootstrap run's summary: demonstrations, SFT loss first and last.")
    sweep: dict[str, Any] | None = _field("A sweep point's: {id, point, overrides} (`ragen sweep`).")
    lineage: dict[str, Any] | None = _field(
        "An offline run's: what it was trained on and from (mode, query, source_runs, source_iterations, "
        "trajectories, init, init_run, init_iteration)."
    )
    evaluated: dict[str, Any] | None = _field("An evaluation run's: target, model (RUN@N or folder) and model_dir.")
    mcp_tools: list[dict[str, Any]] | None = _field(
        "A run with env.mcp: the OpenAI function schemas of its MCP server's tools, as listed when its session opened "
        "(the export's snippet joins them to the env's own)."
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """A null ``kind``, ``status`` or ``resumes`` reads as absent (its default), as the dict reads always did."""
        if isinstance(data, dict) and any(data.get(key, ...) is None for key in _DEFAULTED):
            return {key: value for key, value in data.items() if not (key in _DEFAULTED and value is None)}
        return data

    @classmethod
    def from_stored(cls, data: Any, upgrades: Registry[ManifestUpgrade] = MANIFEST_UPGRADES) -> RunManifest:
        """The manifest of a stored JSON object, brought to :data:`MANIFEST_VERSION`; :class:`ManifestError` (one
        line naming the field) when it is not one."""
        if not isinstance(data, dict):
            raise ManifestError("is not a JSON object")
        version = data.get("manifest_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ManifestError(f"has manifest_version = {_short(version)}, not a version (an integer, 1 or more)")
        if version > MANIFEST_VERSION:
            raise NewerManifestError(
                f"was written with manifest_version {version}, but this ragen-flows only knows versions up to "
                f"{MANIFEST_VERSION}: upgrade ragen-flows (pip install -U ragen-flows) to read it"
            )
        for step in range(version, MANIFEST_VERSION):
            if step in upgrades:
                data = upgrades.get(step)(dict(data))
        return cls.checked({**data, "manifest_version": MANIFEST_VERSION})

    @classmethod
    def checked(cls, data: dict[str, Any]) -> RunManifest:
        """Validate ``data`` as a manifest; :class:`ManifestError` naming the first wrong field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ManifestError(_one_line(exc)) from None

    def stored(self) -> dict[str, Any]:
        """The JSON object written to ``manifest.json``: the fields set (never the defaults of fields a run did
        not set), the unknown keys it was read with, and its version."""
        dumped = self.model_dump(mode="json", exclude_unset=True, fallback=str)  # as json.dumps(default=str) did
        return {**dumped, "manifest_version": self.manifest_version}

    def updated(self, **changes: Any) -> RunManifest:
        """A copy with ``changes`` set (checked like a stored manifest; a key this model does not declare is kept
        as an unknown key)."""
        return self.checked({**self.model_dump(exclude_unset=True), **changes})

    def without(self, *fields: str) -> RunManifest:
        """A copy in which ``fields`` are unset (not written), as in a manifest that never had them."""
        kept = {key: value for key, value in self.model_dump(exclude_unset=True).items() if key not in fields}
        return self.checked(kept)

    def with_attempt(self, **changes: Any) -> RunManifest:
        """A copy whose last entry of ``resumes`` (this attempt's) has ``changes``; unchanged when never resumed."""
        if not self.resumes:
            return self
        return self.updated(resumes=[*self.resumes[:-1], {**self.resumes[-1], **changes}])


_DEFAULTED = ("kind", "status", "resumes")  # the fields whose default is not null

_EXPECTED = {"string_type": "a text", "int_type": "an integer", "dict_type": "a mapping", "list_type": "a list"}


def _one_line(exc: ValidationError) -> str:
    """The first problem of a failed validation in words: ``has <field> = <value>, not <expected>``."""
    error = exc.errors(include_url=False)[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    if error["type"] == "missing":
        return f"has no {where}"
    shown = f"has {where} = {_short(error['input'])}"
    expected = _EXPECTED.get(error["type"])
    return f"{shown}, not {expected}" if expected else f"{shown}: {error['msg'][:1].lower()}{error['msg'][1:]}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:50] + "..."
