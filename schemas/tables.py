"""Arrow schemas of every table in the trajectory lake. Every table and every column carries a description.

Parquet tables are stored table-first, partitioned by run and iteration (not in hive key=value form, so no tool
infers a partition column):
``<root>/<table>/run-<id>/iteration-<n>/part-*.parquet``; files also hold ``run_id`` and ``iteration`` as
ordinary columns, so each file is self-describing. The ``runs`` table is the exception: it is derived from the run
manifests (``runs/<run_id>/manifest.json``), which change while a run is alive (status, timestamps), so no Parquet
copy of them can go stale.

Each table has its own ``schema_version``, stored in the Arrow schema metadata (``b"schema_version"``) of every file
written; each column's description is stored in its field metadata (``b"description"``). A column added after the
table's first version names the version that added it (``added_in``) and, unless nullable, a ``default``: readers of
older files fill it in (see :mod:`schemas.versions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 1
"""The first schema version of every table (tables bump their own ``TableSpec.version`` independently)."""

TIMESTAMP = pa.timestamp("us", tz="UTC")
# What went wrong with a tool env's call, the turns table's tool_calls.error (ragen_core.tools.calls: CallRecord)
TOOL_ERRORS = {
    "bad_json": "the call did not parse (not JSON, no name, a tag not closed)",
    "unknown_tool": "the call named no tool of the env",
    "bad_arguments": "the arguments do not fit the tool's schema (missing, unknown or of the wrong type)",
    "raised": "the tool raised an exception",
    "timeout": "the tool did not return within env.tool_timeout_s",
    "not_run": "the call came after the reply's budget (env.max_actions_per_turn, the actions left) or the end, or "
    "in a reply that broke the format (rollout.reply_format)",
}
# One call of a tool env's reply (ragen_core.tools.CallRecord), an item of the turns table's tool_calls.
TOOL_CALL = pa.struct(
    [
        ("name", pa.string()),
        ("arguments", pa.string()),
        ("result", pa.string()),
        ("error", pa.string()),
        ("duration_s", pa.float64()),
    ]
)


@dataclass(frozen=True)
class ColumnSpec:
    """One column: Arrow type, description, nullability, and the table version that added it."""

    name: str
    type: pa.DataType
    description: str
    nullable: bool = False
    added_in: int = SCHEMA_VERSION
    default: Any = None


@dataclass(frozen=True)
class TableSpec:
    """A table: its columns, its primary key, its schema version and where its rows live.

    ``source`` is ``"parquet"`` (partitioned files written by the lake) or ``"manifest"`` (derived from the run
    manifests; read-only through the lake). ``computed``: columns the table's SQL view (``ragen sql``) adds from the
    data root's state when it is queried, after the stored ones; never stored, since they change after the rows are
    written (a checkpoint pruned later), so they take no part in the schema version.
    """

    name: str
    columns: tuple[ColumnSpec, ...]
    key: tuple[str, ...]
    version: int = SCHEMA_VERSION
    description: str = ""
    source: str = "parquet"
    computed: tuple[ColumnSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [c.name for c in (*self.columns, *self.computed)]
        problems = []
        if len(set(names)) != len(names):
            problems.append("duplicate column names")
        problems += [f"key column {k!r} is not a column" for k in self.key if k not in names]
        for c in self.columns:
            if not 1 <= c.added_in <= self.version:
                problems.append(f"column {c.name!r}: added_in={c.added_in} outside 1..{self.version}")
            if c.added_in > SCHEMA_VERSION and not c.nullable and c.default is None:
                problems.append(f"column {c.name!r} was added later: make it nullable or give it a default")
        if self.source not in ("parquet", "manifest"):
            problems.append(f"source must be 'parquet' or 'manifest', not {self.source!r}")
        if problems:
            raise ValueError(f"table spec {self.name!r}: " + "; ".join(problems))

    def columns_at(self, version: int) -> tuple[ColumnSpec, ...]:
        """The columns a file of ``version`` holds (those added in that version or before)."""
        return tuple(c for c in self.columns if c.added_in <= version)

    def arrow_schema_at(self, version: int) -> pa.Schema:
        """The Arrow schema files of ``version`` were written with (descriptions and version in the metadata)."""
        fields = [
            pa.field(c.name, c.type, nullable=c.nullable, metadata={"description": c.description})
            for c in self.columns_at(version)
        ]
        metadata = {"table": self.name, "schema_version": str(version), "description": self.description}
        return pa.schema(fields, metadata=metadata)

    @property
    def arrow_schema(self) -> pa.Schema:
        """The current Arrow schema (what writers must produce and readers return)."""
        return self.arrow_schema_at(self.version)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def queried_schema(self) -> pa.Schema:
        """The columns of the table's SQL view: the stored ones, then the :attr:`computed` ones."""
        schema = self.arrow_schema
        for c in self.computed:
            field = pa.field(c.name, c.type, nullable=c.nullable, metadata={"description": c.description})
            schema = schema.append(field)
        return schema

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}; columns: {', '.join(self.column_names)}")


_RUN = ColumnSpec("run_id", pa.string(), "Run identifier.")
_KEY = (
    _RUN,
    ColumnSpec(
        "iteration", pa.int32(), "Iteration; rows of iteration i were generated by the policy after i updates."
    ),
    ColumnSpec("split", pa.string(), "'train' (used for updates) or 'val' (validation on fixed instances)."),
    ColumnSpec("env", pa.string(), "Registered environment name."),
    ColumnSpec("group_id", pa.int32(), "Group (initial state) within (run, iteration, split, env)."),
    ColumnSpec("traj_index", pa.int32(), "Member of the group; all members share env_seed."),
)
TRAJECTORY_KEY = tuple(c.name for c in _KEY)

TRAJECTORIES = TableSpec(
    "trajectories",
    _KEY
    + (
        ColumnSpec("env_seed", pa.int64(), "Seed of the environment instance."),
        ColumnSpec("num_turns", pa.int32(), "Model replies in the trajectory."),
        ColumnSpec("num_actions", pa.int32(), "Actions executed in the environment."),
        ColumnSpec("env_reward", pa.float64(), "Sum of environment rewards."),
        ColumnSpec("format_penalty", pa.float64(), "Sum of format penalties (<= 0)."),
        ColumnSpec("total_reward", pa.float64(), "Training score: env_reward + format_penalty."),
        ColumnSpec("success", pa.bool_(), "The environment counts the instance as solved."),
        ColumnSpec("truncated", pa.bool_(), "Some reply was cut at the token limit."),
        ColumnSpec("response_length", pa.int32(), "Tokens produced by the policy (sum of loss_mask)."),
        ColumnSpec(
            "group_reward_std", pa.float64(), "In-group std of total_reward (train rows, set by the filter).", True
        ),
        ColumnSpec("kept", pa.bool_(), "Filter decision: used for the update (train rows; null for val).", True),
        ColumnSpec("policy_version", pa.int32(), "Number of updates the generating policy had received."),
        ColumnSpec("behavior_source", pa.string(), "'policy' (sampled by the model) or 'scripted'."),
        ColumnSpec("temperature", pa.float32(), "Sampling temperature of the replies."),
        ColumnSpec("config_hash", pa.string(), "Hash of the run's resolved config."),
        ColumnSpec(
            "input_ids",
            pa.list_(pa.int32()),
            "The whole chat as token ids (one training sequence; windowed modes: see segment_lengths).",
        ),
        ColumnSpec("loss_mask", pa.list_(pa.int8()), "1 on tokens the policy produced, 0 on prompt/env tokens."),
        ColumnSpec(
            "behavior_logprobs",
            pa.list_(pa.float32()),
            "Sampler's log-prob per token (0 at masked-out positions); null for scripted rows.",
            True,
        ),
        ColumnSpec(
            "filter_metric_value",
            pa.float64(),
            "Group's value of algorithm.filter_metric that the filter ranked (train rows, set by the filter).",
            True,
            added_in=2,
        ),
        ColumnSpec(
            "segment_lengths",
            pa.list_(pa.int32()),
            "Windowed context modes: lengths of the independent per-turn sequences packed in input_ids, in order "
            "(each is the turn's window prompt then its reply); null: input_ids is one sequence (full mode).",
            True,
            added_in=2,
        ),
        ColumnSpec(
            "end_reason",
            pa.string(),
            "Why the trajectory ended: 'success' (the env counts it solved); the env's word for a loss when it "
            "ended the episode unsolved ('failure' by default; frozen_lake 'hole', bandit 'worse_arm', countdown "
            "and calculator 'wrong_answer', game_2048 'no_moves'); 'env_step_limit' (the env's own step limit); "
            "'action_budget' "
            "(env.max_actions_per_traj used); then, when the turns ran out (env.max_turns): 'token_limit' (the last "
            "reply was cut at rollout.max_new_tokens), 'format_error' (the last reply drew the format penalty) or "
            "'turn_limit'. Null in rows stored before it was kept.",
            True,
            added_in=3,
        ),
        ColumnSpec(
            "final_state",
            pa.string(),
            "The env's state after the last step (the text its last step returned; the reset's when no action "
            "ran): how the episode ended, which no turn's observation shows. Null in rows stored before it was kept.",
            True,
            added_in=3,
        ),
    ),
    key=TRAJECTORY_KEY,
    version=3,
    description="One row per trajectory: scores, filter decision, how it ended and the token-exact training sequence.",
)

TURNS = TableSpec(
    "turns",
    _KEY
    + (
        ColumnSpec("turn_index", pa.int32(), "0-based turn number."),
        ColumnSpec("observation", pa.string(), "User message shown before the reply (env text)."),
        ColumnSpec(
            "response",
            pa.string(),
            "The reply as parsed: the reply prefix that ended the prompt (<think> by default) and the generated text.",
        ),
        ColumnSpec("think", pa.string(), "Content of <think>."),
        ColumnSpec("answer", pa.string(), "Content of <answer>."),
        ColumnSpec("actions", pa.list_(pa.string()), "Actions executed this turn (canonical names)."),
        ColumnSpec("valid", pa.bool_(), "Reply parsed and every named action was valid."),
        ColumnSpec("format_ok", pa.bool_(), "Reply had the required tags."),
        ColumnSpec("reward", pa.float64(), "Environment reward collected this turn."),
        ColumnSpec("penalty", pa.float64(), "Format penalty of this turn."),
        ColumnSpec("done", pa.bool_(), "Trajectory ended after this turn."),
        ColumnSpec("truncated", pa.bool_(), "Reply was cut at the token limit."),
        ColumnSpec("response_tokens", pa.int32(), "Tokens in the reply."),
        ColumnSpec(
            "info",
            pa.string(),
            "Extra step information (JSON): action_is_effective per executed action; "
            "teacher_actions, teacher_agree, teacher_chance where the env has a teacher.",
        ),
        ColumnSpec(
            "tool_calls",
            pa.list_(TOOL_CALL),
            "A tool env's calls of this reply, in order, run or not: the tool's name (null when the call did not "
            "parse), its arguments as JSON (the call's text when it did not parse), the result the agent was told "
            "(the tool's text, or the error), the error (null when it ran well; "
            + ", ".join(f"'{kind}': {meaning}" for kind, meaning in TOOL_ERRORS.items())
            + ") and duration_s, the wall-clock seconds it ran (0 when not run; the one field two equal runs differ "
            "in). Null for envs without tools and in rows stored before it was kept.",
            True,
            added_in=2,
        ),
    ),
    key=TRAJECTORY_KEY + ("turn_index",),
    version=2,
    description="One row per turn of every trajectory: what the model saw, said and did (and a tool env's calls).",
)

METRICS = TableSpec(
    "metrics",
    (
        _RUN,
        ColumnSpec("iteration", pa.int32(), "Iteration the value describes."),
        ColumnSpec("name", pa.string(), "Namespaced metric name, e.g. 'rollout/reward_mean', 'val/bandit/success'."),
        ColumnSpec("value", pa.float64(), "Metric value."),
    ),
    key=("run_id", "iteration", "name"),
    description="Iteration metrics in long format: one row per (run, iteration, name).",
)

EVALUATIONS = TableSpec(
    "evaluations",
    (
        _RUN,
        ColumnSpec("iteration", pa.int32(), "Validated policy had received this many updates."),
        ColumnSpec("env", pa.string(), "Validation environment."),
        ColumnSpec("instances", pa.int32(), "Fixed validation instances (groups) evaluated."),
        ColumnSpec("k", pa.int32(), "Samples per instance."),
        ColumnSpec("temperature", pa.float32(), "Sampling temperature of the validation replies."),
        ColumnSpec("success_rate", pa.float64(), "Share of all samples that solved their instance."),
        ColumnSpec("pass_at_k", pa.float64(), "Share of instances solved by at least one of their k samples."),
        ColumnSpec("reward_mean", pa.float64(), "Mean trajectory score (total_reward) over all samples."),
        ColumnSpec("response_length_mean", pa.float64(), "Mean policy tokens per trajectory."),
    ),
    key=("run_id", "iteration", "env"),
    description="Validation results per (run, iteration, env), computed from the published split='val' rows.",
)

# The lineage of an offline run (`ragen retrain`): what it was trained on and from (null for other runs).
_LINEAGE = (
    ColumnSpec("offline_mode", pa.string(), "Offline re-training mode, 'sft' or 'pg'.", True, added_in=2),
    ColumnSpec("source_query", pa.string(), "The SQL that selected the trajectories it trained on.", True, added_in=2),
    ColumnSpec(
        "source_runs", pa.list_(pa.string()), "Runs whose trajectories it trained on (sorted).", True, added_in=2
    ),
    ColumnSpec(
        "source_iterations",
        pa.list_(pa.struct([("run_id", pa.string()), ("iterations", pa.list_(pa.int32()))])),
        "Per source run, the iterations of its trajectories that were selected (sorted).",
        True,
        added_in=2,
    ),
    ColumnSpec("source_trajectories", pa.int64(), "Trajectories it trained on.", True, added_in=2),
    ColumnSpec("init_model", pa.string(), "Model folder it started from (--init, resolved).", True, added_in=2),
    ColumnSpec(
        "init_run",
        pa.string(),
        "Run whose checkpoint it started from (--init run:<id>@<n> or that run's checkpoint folder); null when it "
        "started from another model.",
        True,
        added_in=2,
    ),
    ColumnSpec("init_iteration", pa.int32(), "Iteration (updates) of init_run's checkpoint.", True, added_in=2),
)

RUNS = TableSpec(
    "runs",
    (
        _RUN,
        ColumnSpec(
            "kind",
            pa.string(),
            "'train' (a StarPO run), 'bootstrap' (scripted demonstrations + SFT), 'offline' (`ragen retrain`) or "
            "'evaluation' (`ragen eval`).",
        ),
        ColumnSpec(
            "status",
            pa.string(),
            "'running', 'completed', 'failed', 'interrupted' (Ctrl-C; `ragen resume` continues it) or 'deleting' "
            "while `ragen runs rm` removes it.",
        ),
        ColumnSpec("config_json", pa.string(), "Resolved config as sorted-key JSON."),
        ColumnSpec("config_hash", pa.string(), "Hash of the resolved config."),
        ColumnSpec("seed", pa.int64(), "Run seed.", True),
        ColumnSpec("versions_json", pa.string(), "Library versions that decide the run's numbers, as JSON."),
        ColumnSpec("git_commit", pa.string(), "Commit of the code that ran, when known.", True),
        ColumnSpec("model_dir", pa.string(), "Model folder the run started from (or built, for bootstrap).", True),
        ColumnSpec("created_at", TIMESTAMP, "When the run started (UTC)."),
        ColumnSpec("updated_at", TIMESTAMP, "Last manifest update (UTC)."),
        ColumnSpec("iterations_done", pa.int32(), "Committed iterations (commit markers), final validation included."),
        ColumnSpec("last_committed_iteration", pa.int32(), "Highest committed iteration; null before any.", True),
        ColumnSpec("error", pa.string(), "Error of a failed run.", True),
        ColumnSpec("sweep_id", pa.string(), "Sweep the run is a point of (`ragen sweep`); null otherwise.", True),
        ColumnSpec("sweep_point", pa.int32(), "Index of the run's point in its sweep.", True),
        ColumnSpec(
            "overrides_json", pa.string(), "The sweep point's key=value overrides of the base config, as JSON.", True
        ),
        *_LINEAGE,
    ),
    key=("run_id",),
    version=2,
    description="One row per run, derived from runs/<run_id>/manifest.json and the run's commit markers.",
    source="manifest",
)

CHECKPOINTS = TableSpec(
    "checkpoints",
    (
        _RUN,
        ColumnSpec("iteration", pa.int32(), "Iteration after whose update the weights were saved."),
        ColumnSpec(
            "format",
            pa.string(),
            "'deepspeed' (engine + optimizer state, for resume), 'hf' (weights) or, for a run with actor.lora, 'lora' "
            "(the adapters, trained on the run's start model).",
        ),
        ColumnSpec("path", pa.string(), "Checkpoint folder (its hf/ or adapter/ folder for those formats)."),
        ColumnSpec("metrics_json", pa.string(), "The iteration's metrics at save time, as JSON."),
        ColumnSpec("created_at", TIMESTAMP, "When the checkpoint was written (UTC)."),
    ),
    key=("run_id", "iteration", "format"),
    description="Saved checkpoints: where, in which format, and the metrics they were saved with. A run keeps its "
    "newest trainer.keep_last checkpoints and deletes the older ones; their rows stay, with available = false.",
    computed=(
        ColumnSpec(
            "available",
            pa.bool_(),
            "Computed when queried: the checkpoint folder is still there, complete (false once trainer.keep_last "
            "pruned it). Its folder is iteration=<iteration + 1>: `ragen eval <run_id>@<iteration + 1>` evaluates it.",
        ),
    ),
)

EVENTS = TableSpec(
    "events",
    (
        _RUN,
        ColumnSpec("iteration", pa.int32(), "Iteration the event belongs to."),
        ColumnSpec("kind", pa.string(), "Event kind, e.g. 'early_warning' (collapse indicator), 'resume', 'info'."),
        ColumnSpec("metric", pa.string(), "Metric the event is about.", True),
        ColumnSpec("value", pa.float64(), "The metric's value.", True),
        ColumnSpec("threshold", pa.float64(), "Threshold the value crossed.", True),
        ColumnSpec("message", pa.string(), "Human-readable explanation."),
        ColumnSpec("created_at", TIMESTAMP, "When the event was recorded (UTC)."),
    ),
    key=("run_id", "iteration", "kind", "metric"),
    description="Run events such as collapse early warnings (Echo Trap); at most one per (iteration, kind, metric).",
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec for spec in (TRAJECTORIES, TURNS, METRICS, EVALUATIONS, RUNS, CHECKPOINTS, EVENTS)
}
