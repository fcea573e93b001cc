"""Where everything lies under the data root: this module spells every folder and file name of the lake, and builds
every path from them. Nothing else joins a lake name onto a path (``tests/test_architecture.py`` checks it); the
lake (:class:`~ragen_core.storage.lake.DataLake`) hands these paths out, checked to be real folders
(:mod:`ragen_core.storage.trust`, which also holds every name it reads back to these rules).

Layout 2 under the data root::

    <table>/run-<id>/iteration-<n>/part-<token>-<k>.parquet        published rows (what readers see; <token>: of the
                                                                   stage, :func:`stage_token`)
    <table>/run-<id>/iteration-<n>/.compaction.json                marker of a compaction (``parts``, ``compaction``)
    _layout.json                                                   the layout version (``versioning``, ``upgrade``)
    _staging/<run_id>/<iteration>/<stage>/<table>/...              a stage's output (part-<stage>-<k>), unpublished
    _staging/<run_id>/<iteration>/<stage>/_DONE.json               the stage finished (its result payload)
    _commits/<run_id>/iteration=<n>.json                           the iteration is committed
    _commits/<run_id>/parts/<table>/iteration=<n>.json             the part files the lake published into a partition,
                                                                   with their sizes (``parts``: readers take only
                                                                   those)
    quarantine/run_id=<id>/iteration=<n>/<stage>/report.json       batches that failed validation, with the report
    runs/<run_id>/manifest.json                                    the run manifest (source of the ``runs`` table)
    runs/<run_id>/writer.lock                                      held by the run's one writer (``locks``)
    runs/<run_id>/writer.lease                                     its lease, which holds across hosts (``lease``)
    runs/<run_id>/store.lease                                      in a bucket: its lease object (``storelease``;
                                                                   never in a local copy)
    runs/<run_id>/.space-reserve                                   disk space a running run holds back, released
                                                                   to record its failure when the disk fills
                                                                   (``space``)
    runs/<run_id>/checkpoints/iteration=<n>/                       a checkpoint after n updates: checkpoint.json,
                                                                   actor/, critic/, hf/ (or under LoRA adapter/)
                                                                   (``training.checkpoint``)
    runs/<run_id>/update_group/policy/                             a launched update group's logs and policy export
    runs/<run_id>/vllm_server/                                     the run's vLLM rollout server's log
    runs/<run_id>/tensorboard/                                     the metrics as TensorBoard event files
    runs/<run_id>/trackers/                                        the experiment trackers' local stores (MLflow's
                                                                   SQLite store, W&B's offline runs) and their run
                                                                   ids (``monitor.trackers``)
    _locks/<run_id>.lock                                           held while a run is compacted or removed
    models/bootstrap-<key>/, models/<tiny model key>/              models built from the settings (cached)
    sweeps/<sweep_id>.json                                         a sweep's plan
    _prefect/<run or sweep>/<attempt>/                             a command's own Prefect home and local server

Layout 1 (``run_id=<id>/iteration=<n>/part-<stage>-<k>.parquet``, ``_COMPACTION.json``) is read only by the
upgrade (:mod:`ragen_core.storage.maintenance.upgrade`). The names are chosen for the other tools that read the folders
(docs/lake.md, "Reading the lake with other tools"): no ``key=value`` table folder, no split word of Hugging Face
``datasets`` in a part name, only ``.parquet`` files, the marker hidden.

Three folders are handed whole to the component that works in them: ``update_group/`` to the launched update group
(:mod:`ragen_core.training.group`: its control file, ``group-<pid>.log``, torchrun's ``torchelastic/``; the policy
export inside it is the layout's), ``vllm_server/`` to the rollout server (:mod:`ragen_core.rollout.vllm_local`:
``server.log``, its ready file) and ``trackers/`` to the experiment trackers (:mod:`ragen_core.monitor.trackers`:
their stores and the file of their run ids). Those files are the components' own, which nothing of the lake reads
back, so they name them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from ragen_core.storage.files import LakeError, check_name
from ragen_core.storage.names import validate_run_id

PART_NAME = re.compile(r"part-[A-Za-z0-9_][A-Za-z0-9._-]{0,200}\.parquet")
MERGED_NAME = re.compile(r"part-compacted-[0-9a-f]{16}\.parquet")
ITERATION_FOLDER = re.compile(r"iteration=(0|[1-9][0-9]{0,17})")  # checkpoint folders and commit markers
CHECKPOINT_NAME = re.compile(r"^iteration=(\d+)$")  # what lists as a checkpoint folder

# -- the names of table folders and part files (layout 2) -----------------------------------------------------------
LAYOUT_VERSION = 2
LAYOUT_FILE = "_layout.json"  # {"layout_version": n} at the data root: ragen_core.storage.versioning
RUN_FOLDER_PREFIX = "run-"
ITERATION_PREFIX = "iteration-"
PARTITION_ITERATION = re.compile(r"iteration-(0|[1-9][0-9]{0,17})")
COMPACTION_MARKER = ".compaction.json"  # hidden: the tools that read the folders see only Parquet files
MERGED_PREFIX = "part-compacted-"
# layout 1, read only by the upgrade
OLD_RUN_FOLDER_PREFIX = "run_id="
OLD_COMPACTION_MARKER = "_COMPACTION.json"
UPGRADING_PREFIX = ".upgrading-"  # a partition being filled by `ragen upgrade-lake`, beside its run folder
UPGRADE_HINT = "upgrade it once with `ragen upgrade-lake --data-root {root}` (safe to interrupt and run again)"

# -- the folders and files beside the tables ------------------------------------------------------------------------
RUNS = "runs"
STAGING = "_staging"
COMMITS = "_commits"
QUARANTINE = "quarantine"
LOCKS = "_locks"
MODELS = "models"
SWEEPS = "sweeps"
PREFECT = "_prefect"
STORE_STATE = "_object_store.json"  # in a bucket's local copy: the bucket's URL and what the copy holds of it
KEYED_ITERATION = "iteration="  # commit markers, quarantine and checkpoint folders
PARTS_RECORDS = "parts"  # _commits/<run_id>/parts/<table>/iteration=<n>.json: what the lake published there
QUARANTINE_RUN_PREFIX = "run_id="
DONE_MARKER = "_DONE.json"  # a stage finished: its result payload
QUARANTINE_REPORT = "report.json"
MANIFEST = "manifest.json"
WRITER_LOCK = "writer.lock"
WRITER_LEASE = "writer.lease"
STORE_LEASE = "store.lease"  # a data root in a bucket: the run's lease object there (``storelease``)
SPACE_RESERVE = ".space-reserve"  # hidden: no reader lists it
CHECKPOINTS = "checkpoints"
UPDATE_GROUP = "update_group"
POLICY_EXPORT = "policy"
VLLM_SERVER = "vllm_server"
SERVED_ADAPTER_PREFIX = "adapter-v"  # + a policy version: the adapters a vLLM server loaded for that version
SERVED_START = "start"  # the start model a vLLM server loads when the run merged model.adapter into it
SAMPLER = "sampler"
TENSORBOARD = "tensorboard"
TRACKERS = "trackers"
BOOTSTRAP_PREFIX = "bootstrap-"
DELETING_PREFIX = ".deleting-"  # a run's table folder being removed (hidden: readers skip it)
# inside a checkpoint folder (ragen_core.training.checkpoint writes them)
CHECKPOINT_INFO = "checkpoint.json"  # written last into a checkpoint folder: its presence marks the folder complete
CHECKPOINT_HF = "hf"  # the Hugging Face export of the policy
CHECKPOINT_ADAPTER = "adapter"  # under LoRA, in place of hf/: the PEFT adapters and the tokenizer
CHECKPOINT_ACTOR = "actor"  # DeepSpeed engine states
CHECKPOINT_CRITIC = "critic"
CHECKPOINT_ENGINE_STATE = "state"  # DeepSpeed's tag: the sub-folder of actor/ and critic/ it writes
HF_EXPORT = CHECKPOINT_HF


def run_folder_name(run_id: str) -> str:
    """The folder of a run's rows in a table folder."""
    return f"{RUN_FOLDER_PREFIX}{run_id}"


def iteration_folder_name(iteration: int) -> str:
    """The folder of one iteration's rows in a run's folder."""
    return f"{ITERATION_PREFIX}{int(iteration)}"


def upgrading_partition(partition: Path) -> Path:
    """The hidden folder beside ``partition`` that ``ragen upgrade-lake`` fills before renaming it to the partition."""
    return partition.with_name(f"{UPGRADING_PREFIX}{partition.name}")


def stage_token(stage: str) -> str:
    """The stage's part of a published part name: 12 hex digits of its SHA-256. Stage names hold env names (an
    evaluation is ``eval-<env>``), and hex digits never spell a split word of Hugging Face ``datasets``."""
    return hashlib.sha256(stage.encode()).hexdigest()[:12]


def staged_part_name(stage: str, part: int) -> str:
    """A part file's name in a stage's staging folder (and in quarantine): ``part-<stage>-<part:05d>.parquet``."""
    return f"part-{stage}-{int(part):05d}.parquet"


def published_part_name(stage: str, part: int) -> str:
    """A part file's name once published into its partition: ``part-<stage token>-<part:05d>.parquet``."""
    return f"part-{stage_token(stage)}-{int(part):05d}.parquet"


def published_name_of(stage: str, staged: str) -> str:
    """The published name of the staged part file ``staged`` of ``stage``."""
    number = staged.removesuffix(".parquet").rsplit("-", 1)[-1]
    if staged != staged_part_name(stage, int(number) if number.isdigit() else 0):
        raise LakeError(f"staged file {staged!r} of stage {stage!r} is not {staged_part_name(stage, 0)!r} or the like")
    return published_part_name(stage, int(number))


def merged_name(names: list[str]) -> str:
    """The deterministic name of the file that merges the part files ``names`` (a compaction's)."""
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
    return f"{MERGED_PREFIX}{digest}.parquet"


def published_by_stage(name: str, stages: Iterable[str]) -> bool:
    """Whether the published part file ``name`` was published by one of ``stages``."""
    return any(name.startswith(f"part-{stage_token(stage)}-") for stage in stages)


def old_layout_error(root: Path, found: Path) -> LakeError:
    """The error for a folder of layout 1 found where layout 2 is read or written; it names the data root as the
    user does: a bucket's URL when ``root`` is the local copy of one."""
    name, where = str(root), Path(found)
    if where.is_relative_to(root):
        where = where.relative_to(root)
    try:
        url = json.loads((Path(root) / STORE_STATE).read_text()).get("url")
    except (OSError, ValueError, AttributeError):
        url = None
    if isinstance(url, str):
        name = url
    return LakeError(
        f"data root {name!r} has tables in the old lake layout 1 ({where.as_posix()!r}); "
        + UPGRADE_HINT.format(root=name)
    )


# -- paths under the data root (run ids checked: a backstop behind the entry points) ---------------------------------
def top_folders(root: Path) -> list[Path]:
    """The folders beside the tables that hold runs' files (a run's removal checks them for links)."""
    return [root / name for name in (STAGING, COMMITS, QUARANTINE, PREFECT, RUNS, MODELS)]


def deleting(folder: Path) -> Path:
    """The hidden name a folder is renamed to before it is deleted whole."""
    return folder.with_name(f"{DELETING_PREFIX}{folder.name}")


def layout_file(root: Path) -> Path:
    """The data root's layout version file."""
    return root / LAYOUT_FILE


def table_dir(root: Path, table: str) -> Path:
    """A table's folder."""
    return root / table


def partition_dir(table_folder: Path, run_id: str, iteration: int | None = None) -> Path:
    """A run's folder of a table (``iteration`` None), or one iteration's folder in it."""
    folder = table_folder / run_folder_name(validate_run_id(run_id))
    return folder if iteration is None else folder / iteration_folder_name(iteration)


def old_partition_dir(table_folder: Path, run_id: str) -> Path:
    """A run's folder of a table in layout 1 (read by the upgrade only)."""
    return table_folder / f"{OLD_RUN_FOLDER_PREFIX}{run_id}"


def compaction_marker(folder: Path, old: bool = False) -> Path:
    """A partition folder's compaction marker (``old``: its layout 1 name)."""
    return folder / (OLD_COMPACTION_MARKER if old else COMPACTION_MARKER)


def staging_dir(root: Path, run_id: str | None = None, iteration: int | None = None) -> Path:
    """The staging folder of every run, of one run, or of one iteration of it."""
    folder = root / STAGING
    if run_id is not None:
        folder = folder / validate_run_id(run_id)
    return folder if iteration is None else folder / str(int(iteration))


def stage_dir(root: Path, run_id: str, iteration: int, stage: str) -> Path:
    """A stage's staging folder (one folder per table in it)."""
    return staging_dir(root, run_id, iteration) / check_name("stage", stage)


def done_marker(stage_folder: Path) -> Path:
    """The marker of a finished stage in its staging folder."""
    return stage_folder / DONE_MARKER


def commits_dir(root: Path, run_id: str | None = None) -> Path:
    """The commit markers' folder of every run, or of one run."""
    return root / COMMITS if run_id is None else root / COMMITS / validate_run_id(run_id)


def commit_marker_name(iteration: int) -> str:
    """A commit marker's file name (its stem matches :data:`ITERATION_FOLDER`)."""
    return f"{KEYED_ITERATION}{int(iteration)}.json"


def parts_record(root: Path, table: str, run_id: str, iteration: int) -> Path:
    """The record of the part files the lake published into one partition (:mod:`ragen_core.storage.parts`)."""
    return commits_dir(root, run_id) / PARTS_RECORDS / check_name("table", table) / commit_marker_name(iteration)


def parts_record_of(partition: Path) -> Path:
    """The record of the partition folder ``<root>/<table>/run-<id>/iteration-<n>``; a folder of another form
    raises."""
    folder = Path(partition)
    run_name, match = folder.parent.name, PARTITION_ITERATION.fullmatch(folder.name)
    if match is None or not run_name.startswith(RUN_FOLDER_PREFIX):
        raise LakeError(f"{str(folder)!r} is not a <table>/{RUN_FOLDER_PREFIX}<id>/{ITERATION_PREFIX}<n> folder")
    table_folder = folder.parent.parent
    return parts_record(table_folder.parent, table_folder.name, run_name[len(RUN_FOLDER_PREFIX) :], int(match[1]))


def quarantine_dir(root: Path, run_id: str | None = None, iteration: int | None = None, stage: str = "") -> Path:
    """The quarantine folder of every run, of one run, or of one stage of one iteration."""
    if run_id is None:
        return root / QUARANTINE
    folder = root / QUARANTINE / f"{QUARANTINE_RUN_PREFIX}{validate_run_id(run_id)}"
    if iteration is None:
        return folder
    return folder / f"{KEYED_ITERATION}{int(iteration)}" / check_name("stage", stage)


def quarantine_report(folder: Path) -> Path:
    """The report of a quarantined batch."""
    return folder / QUARANTINE_REPORT


def quarantined_run(name: str) -> str | None:
    """The run id a folder under ``quarantine/`` names (unchecked), None when it names none."""
    return name.removeprefix(QUARANTINE_RUN_PREFIX) if name.startswith(QUARANTINE_RUN_PREFIX) else None


def run_dir(root: Path, run_id: str | None = None) -> Path:
    """The folder of every run's own files, or of one run's."""
    return root / RUNS if run_id is None else root / RUNS / validate_run_id(run_id)


def manifest_file(run_folder: Path) -> Path:
    """A run's manifest in its run folder."""
    return run_folder / MANIFEST


def space_reserve_file(run_folder: Path) -> Path:
    """The disk space a running run holds back in its run folder (:mod:`ragen_core.storage.maintenance.space`)."""
    return run_folder / SPACE_RESERVE


def writer_lock_file(root: Path, run_id: str) -> Path:
    """The writer lock of a run (:mod:`ragen_core.storage.locks`)."""
    return run_dir(root, run_id) / WRITER_LOCK


def writer_lease_file(lock_file: Path) -> Path:
    """The writer lease beside a run's writer lock file (:mod:`ragen_core.storage.lease`)."""
    return lock_file.with_name(WRITER_LEASE)


def housekeeping_lock_file(root: Path, run_id: str) -> Path:
    """The lock a run's compaction and removal hold."""
    return root / LOCKS / f"{validate_run_id(run_id)}.lock"


def run_subdir(root: Path, run_id: str, name: str) -> Path:
    """One of a run's folders: :data:`CHECKPOINTS`, :data:`UPDATE_GROUP`, :data:`VLLM_SERVER`, :data:`SAMPLER`,
    :data:`TENSORBOARD`, :data:`TRACKERS`."""
    if name not in (CHECKPOINTS, UPDATE_GROUP, VLLM_SERVER, SAMPLER, TENSORBOARD, TRACKERS):
        raise ValueError(f"{name!r} is no folder of a run")
    return run_dir(root, run_id) / name


def served_adapter_dir(server_folder: Path, version: int) -> Path:
    """The adapter folder of policy ``version`` that a vLLM server of a LoRA run loads (in its folder)."""
    return server_folder / f"{SERVED_ADAPTER_PREFIX}{int(version)}"


def served_adapter_versions(server_folder: Path) -> list[int]:
    """The versions whose adapter folders are in a vLLM server's folder, in order."""
    suffixes = (p.name.removeprefix(SERVED_ADAPTER_PREFIX) for p in server_folder.glob(f"{SERVED_ADAPTER_PREFIX}*"))
    return sorted(int(suffix) for suffix in suffixes if suffix.isdigit())


def served_start_dir(server_folder: Path) -> Path:
    """The start model a vLLM server loads where the run's start model is not a folder of its own (``model.adapter``
    merged into it)."""
    return server_folder / SERVED_START


def policy_export_dir(update_group_folder: Path) -> Path:
    """The policy export a launched update group hands to the rollout side."""
    return update_group_folder / POLICY_EXPORT


def checkpoint_folder_name(updates: int) -> str:
    """A checkpoint folder's name (after ``updates`` updates; it matches :data:`ITERATION_FOLDER`)."""
    return f"{KEYED_ITERATION}{int(updates)}"


def checkpoint_file(folder: Path, name: str) -> Path:
    """A part of a checkpoint folder (or of its temporary sibling): :data:`CHECKPOINT_INFO`, :data:`CHECKPOINT_HF`,
    :data:`CHECKPOINT_ADAPTER`, :data:`CHECKPOINT_ACTOR`, :data:`CHECKPOINT_CRITIC`."""
    if name not in (CHECKPOINT_INFO, CHECKPOINT_HF, CHECKPOINT_ADAPTER, CHECKPOINT_ACTOR, CHECKPOINT_CRITIC):
        raise ValueError(f"{name!r} is no part of a checkpoint")
    return Path(folder) / name


def engine_state_dir(folder: Path, role: str) -> Path:
    """The DeepSpeed state of the engine ``role`` (:data:`CHECKPOINT_ACTOR` or :data:`CHECKPOINT_CRITIC`)."""
    return checkpoint_file(folder, role) / CHECKPOINT_ENGINE_STATE


def models_dir(root: Path) -> Path:
    """The folder of the models built from settings (bootstrapped and tiny models)."""
    return root / MODELS


def model_dir(root: Path, name: str) -> Path:
    """The folder of one built model under ``models/`` (``name``: a bootstrap's, :func:`bootstrap_name`)."""
    return models_dir(root) / check_name("model", name)


def building(folder: Path) -> Path:
    """The hidden sibling a model folder is built in by this process, then renamed to ``folder``."""
    return folder.with_name(f".{folder.name}.building-{os.getpid()}")


def bootstrap_name(key: str) -> str:
    """The run id of a bootstrap, and its model's folder name under ``models/``."""
    return f"{BOOTSTRAP_PREFIX}{key}"


def sweep_file(root: Path, sweep_id: str) -> Path:
    """The stored plan of a sweep."""
    return root / SWEEPS / f"{check_name('sweep id', sweep_id)}.json"


def prefect_home(root: Path, name: str | None = None) -> Path:
    """The folder of every command's Prefect home, or of one command attempt's."""
    return root / PREFECT if name is None else root / PREFECT / check_name("Prefect home", name)
