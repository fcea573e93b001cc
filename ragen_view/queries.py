"""What the viewer's pages show, read from the lake by read-only DuckDB queries (``ragen_core.storage.query``).

Every page reads only what it shows: the runs page the manifests and the ``metrics``/``evaluations`` tables, a run's
page its own metrics, an iteration's page that one partition of ``trajectories`` (paged, sorted and filtered in
DuckDB), a trajectory's page its one row and its turns. No page reads a run whole, so a page of a lake of a million
trajectories opens as fast as one of a demo (benchmarks/view_bench.py). Values from the user (a run id, an env, a
seed, a sort key, bounds) reach DuckDB as parameters or as names picked from fixed lists, never as SQL text; the
one exception is the ``where`` filter of the iteration page, which is SQL by design and is held to the rules of
``ragen sql`` (one read-only query, over a locked-down connection that holds the partition's views only), in a
process of its own bounded in memory and time (:mod:`ragen_view.sandbox`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ragen_core.storage import DataLake, query
from ragen_core.storage.maintenance import runs_overview
from ragen_view import describe, sandbox

PAGE_SIZE = 50
# The curves of a run's page, in their order: (metric name or a pattern with <env>, title). Each is drawn when the
# run logged it; ``val/<env>/...`` names expand to every validation env the run has.
CURVES = (
    ("rollout/success_rate", "training success"),
    ("val/<env>/success", "validation success"),
    ("rollout/reward_mean", "reward (mean)"),
    ("rollout/reward_std", "reward (std across the batch)"),
    ("rollout/in_group_reward_std", "in-group reward std"),
    ("actor/entropy", "entropy"),
    ("rollout/truncated_rate", "truncated share (training)"),
    ("val/<env>/truncated_rate", "truncated share (validation)"),
    ("filter/keep_rate", "filter: kept share"),
    ("rollout/response_length", "response length (tokens)"),
    ("actor/grad_norm", "gradient norm"),
    ("perf/mfu", "MFU"),
    ("perf/tflops", "achieved TFLOP/s"),
    ("perf/update_s", "update wall time (s)"),
    ("perf/tokens_per_s", "update tokens per second"),
    ("perf/peak_rss_gb", "peak RSS (GB)"),
    ("perf/peak_cuda_gb", "peak CUDA memory (GB)"),
)
# The iteration page's sort keys: the name in the URL -> the column (a fixed list: never the user's text).
SORTS = {
    "group": "group_id, traj_index",
    "reward": "total_reward",
    "env_reward": "env_reward",
    "length": "response_length",
    "turns": "num_turns",
    "group_std": "group_reward_std",
    "staleness": "staleness",
    "seed": "env_seed",
    "env": "env",
    "success": "success",
    "truncated": "truncated",
    "kept": "kept",
}
QUERY_TIMEOUT_S = 60.0  # a page's query (a WHERE filter of the user's included) stops after this long
QUERY_MEMORY = "4GB"  # and its joins, sorts and aggregates use at most this much
QUERY_MEMORY_BYTES = 4 * 10**9  # a user's filter runs in a process whose memory may grow by this much (sandbox.py)
PARTITION_TABLES = ("trajectories", "turns")  # the only views an iteration's queries (a filter's included) get
TRAJECTORY_COLUMNS = (
    "split, env, group_id, traj_index, env_seed, num_turns, num_actions, env_reward, format_penalty, total_reward, "
    "success, truncated, response_length, group_reward_std, kept, policy_version, staleness, behavior_source, "
    "temperature"
)
# Every column of ``trajectories`` and the staleness of the batch (iterations between the policy that sampled it and
# the iteration's): what a filter may name.
FILTERABLE = "SELECT *, iteration - policy_version AS staleness FROM trajectories"


class NotFound(LookupError):
    """A run, iteration or trajectory the lake does not hold (the page says so, with status 404)."""


@dataclass(frozen=True)
class Filters:
    """The iteration page's filters, each a parameter of the query (``where``: SQL, checked as ``ragen sql`` checks
    a query)."""

    split: str | None = None
    env: str | None = None
    success: bool | None = None
    truncated: bool | None = None
    kept: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    max_staleness: int | None = None
    where: str | None = None

    def sql(self) -> tuple[str, list[Any]]:
        """The WHERE clause (``TRUE`` when no filter is set) and its parameters."""
        clauses, params = [], []
        for column, value in (
            ("split", self.split),
            ("env", self.env),
            ("success", self.success),
            ("truncated", self.truncated),
            ("kept", self.kept),
        ):
            if value is not None:
                clauses.append(f"{column} IS NOT DISTINCT FROM ?")
                params.append(value)
        for column, low, high in (
            ("total_reward", self.min_reward, self.max_reward),
            ("response_length", self.min_length, self.max_length),
        ):
            if low is not None:
                clauses.append(f"{column} >= ?")
                params.append(low)
            if high is not None:
                clauses.append(f"{column} <= ?")
                params.append(high)
        if self.where:
            clauses.append(f"(\n{self.where}\n)")  # on lines of its own: a trailing -- comment ends with its line
        return (" AND ".join(clauses) or "TRUE"), params


@dataclass
class Page:
    """One page of an iteration's trajectories: the rows, their total under the filters, and the page's place."""

    rows: list[dict[str, Any]]
    total: int
    page: int
    pages: int


@dataclass
class Curves:
    """``{metric: {run_id: [(iteration, value), ...]}}`` of some runs, and the titles of the drawn metrics."""

    series: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


def runs(lake: DataLake) -> list[dict[str, Any]]:
    """Every run (``ragen runs``' overview: kind, status, iterations, last validation success, mean MFU, created_at)
    with its env and advantage estimator from its stored config."""
    overview = _rows(runs_overview(lake))
    configs = {
        r["run_id"]: r
        for r in _rows(
            query(lake, "SELECT run_id, config_json, updated_at FROM runs", tables=("runs",), broken_manifests="row")
        )
    }
    for row in overview:
        config = _config(configs.get(row["run_id"], {}).get("config_json"))
        row["env"] = (config.get("env") or {}).get("name")
        algorithm = config.get("algorithm") or {}
        row["algorithm"] = " ".join(str(v) for v in (algorithm.get("preset"), algorithm.get("adv_estimator")) if v)
        if row["kind"] == "bootstrap":  # it trains on demonstrations: the config's algorithm is its RL run's
            row["algorithm"] = "SFT"
        row["what"] = describe.what(row["kind"], config)
        row["schedule"] = describe.schedule(row["kind"], config)
    return overview


def _config(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def run(lake: DataLake, run_id: str) -> dict[str, Any]:
    """The run's ``runs`` row, its config as a dict (``config``) and its iterations with trajectories."""
    found = _rows(query(lake, "SELECT * FROM runs", run_id=run_id, tables=("runs",), broken_manifests="row"))
    if not found:
        raise NotFound(f"no run {run_id!r} in this data root")
    row = found[0]
    row["config"] = _config(row.get("config_json"))
    row["what"] = describe.what(row["kind"], row["config"], detailed=True)
    row["schedule"] = describe.schedule(row["kind"], row["config"])
    return row


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config tree as ``{"section.key": value}`` (lists and scalars as leaves)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, name + "."))
        else:
            flat[name] = value
    return flat


def config_diff(left: dict[str, Any], right: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, left value, right value)`` of every dotted key whose values differ (a missing key: ``None``)."""
    a, b = flat_config(left), flat_config(right)
    return [(key, a.get(key), b.get(key)) for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key)]


def metric_names(lake: DataLake, run_ids: list[str]) -> list[str]:
    """Every metric name the runs logged, sorted."""
    names: set[str] = set()
    for run_id in run_ids:
        table = query(lake, "SELECT DISTINCT name FROM metrics", run_id=run_id, tables=("metrics",))
        names.update(table["name"].to_pylist())
    return sorted(names)


def curves(lake: DataLake, run_ids: list[str], extra: list[str] | None = None) -> Curves:
    """The :data:`CURVES` the runs logged (and the ``extra`` metrics asked for by name), per run."""
    logged = metric_names(lake, run_ids)
    wanted: dict[str, str] = {}
    for name, title in CURVES:
        if "<env>" in name:
            head, tail = name.split("<env>")
            for found in logged:
                if found.startswith(head) and found.endswith(tail) and found.count("/") == name.count("/"):
                    wanted[found] = f"{title}: {found[len(head) : -len(tail)]}"
        elif name in logged:
            wanted[name] = title
    for name in extra or []:
        if name in logged:
            wanted.setdefault(name, name)
    result = Curves(titles=wanted)
    if not wanted:
        return result
    for run_id in run_ids:
        table = query(
            lake,
            "SELECT name, iteration, value FROM metrics WHERE list_contains(?, name) AND isfinite(value) "
            "ORDER BY name, iteration",
            run_id=run_id,
            params=[list(wanted)],
            tables=("metrics",),
        )
        for name, iteration, value in zip(
            *(table[c].to_pylist() for c in ("name", "iteration", "value")), strict=True
        ):
            result.series.setdefault(name, {}).setdefault(run_id, []).append((int(iteration), float(value)))
    return result


def events(lake: DataLake, run_id: str) -> list[dict[str, Any]]:
    """The run's events (the monitor's early warnings of collapse, an iteration the filter emptied...), oldest
    first."""
    return _rows(
        query(
            lake,
            "SELECT iteration, kind, metric, value, threshold, message FROM events ORDER BY iteration, created_at",
            run_id=run_id,
            tables=("events",),
        )
    )


def iterations(lake: DataLake, run_id: str) -> list[dict[str, Any]]:
    """Per committed iteration of the run, from its metrics (never its trajectories): training success, reward mean
    and std, the filter's kept share, truncated share, and the mean validation success over its val envs."""
    table = query(
        lake,
        """
        SELECT iteration,
               max(value) FILTER (name = 'rollout/success_rate') AS success,
               max(value) FILTER (name = 'rollout/reward_mean') AS reward_mean,
               max(value) FILTER (name = 'rollout/reward_std') AS reward_std,
               max(value) FILTER (name = 'filter/keep_rate') AS kept_share,
               max(value) FILTER (name = 'rollout/truncated_rate') AS truncated,
               avg(value) FILTER (name LIKE 'val/%/success') AS val_success,
               max(value) FILTER (name = 'actor/entropy') AS entropy
        FROM metrics GROUP BY iteration ORDER BY iteration
        """,
        run_id=run_id,
        tables=("metrics",),
    )
    committed = set(lake.committed_iterations(run_id))
    rows = [r for r in _rows(table) if r["iteration"] in committed]  # a crash's uncommitted metrics: no page
    seen = {r["iteration"] for r in rows}
    # a committed iteration that logged no metrics (a bootstrap's demonstrations): its numbers are empty cells
    rows += [{**dict.fromkeys(table.column_names), "iteration": i} for i in sorted(committed - seen)]
    return sorted(rows, key=lambda r: r["iteration"])


def _scoped(
    lake: DataLake | Path,
    sql: str,
    run_id: str,
    iteration: int,
    params: list[Any] | None = None,
    timeout: float | None = None,
) -> pa.Table:
    """A query over one iteration's partition of ``trajectories`` and ``turns`` (no other table has a view), within
    ``timeout`` seconds (None: :data:`QUERY_TIMEOUT_S`) and :data:`QUERY_MEMORY`."""
    return query(
        lake,
        sql,
        run_id=run_id,
        iteration=iteration,
        params=params,
        tables=PARTITION_TABLES,
        timeout=QUERY_TIMEOUT_S if timeout is None else timeout,
        memory_limit=QUERY_MEMORY,
    )


def groups(lake: DataLake, run_id: str, iteration: int) -> list[dict[str, Any]]:
    """The iteration's groups: split, env, size, reward mean and spread (the filter's ``group_reward_std``, else the
    population std of the group's total rewards), kept by the variance filter, success share, truncated share."""
    return _rows(
        _scoped(
            lake,
            """
        SELECT split, env, group_id, count(*) AS size, avg(total_reward) AS reward_mean,
               coalesce(any_value(group_reward_std), stddev_pop(total_reward)) AS reward_std,
               bool_or(kept) AS kept, avg(success::DOUBLE) AS success, avg(truncated::DOUBLE) AS truncated,
               any_value(env_seed) AS env_seed
        FROM trajectories GROUP BY split, env, group_id ORDER BY split DESC, env, group_id
        """,
            run_id,
            iteration,
        )
    )


def envs(lake: DataLake, run_id: str, iteration: int) -> list[str]:
    """The envs of the iteration's trajectories, sorted."""
    table = _scoped(lake, "SELECT DISTINCT env FROM trajectories ORDER BY env", run_id, iteration)
    return table["env"].to_pylist()


def trajectories(
    lake: DataLake,
    run_id: str,
    iteration: int,
    filters: Filters,
    sort: str = "group",
    descending: bool = False,
    page: int = 0,
) -> Page:
    """One page (:data:`PAGE_SIZE` rows) of the iteration's trajectories under ``filters``, sorted by ``sort`` (a key
    of :data:`SORTS`). With a ``where`` filter the queries run in a process of their own, bounded in memory and time
    (:mod:`ragen_view.sandbox`), and a mistake in it is placed in the filter's own text (its line and column)."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; sort by one of: {', '.join(SORTS)}")
    where, params = filters.sql()
    order = ", ".join(f"{c.strip()} {'DESC' if descending else 'ASC'} NULLS LAST" for c in SORTS[sort].split(","))
    if filters.where is None:
        return _page(lake, run_id, iteration, where, params, order, (page, PAGE_SIZE), QUERY_TIMEOUT_S)
    limits = sandbox.Limits(QUERY_TIMEOUT_S, QUERY_MEMORY_BYTES)
    paging = (page, PAGE_SIZE)  # this process's values, handed to the child (which imported its module afresh)
    try:
        return sandbox.run(limits, _page, lake.root, run_id, iteration, where, params, order, paging, limits.timeout_s)
    except duckdb.Error as exc:
        raise placed(exc, where, filters.where) from None


def _page(
    lake: DataLake | Path,
    run_id: str,
    iteration: int,
    where: str,
    params: list[Any],
    order: str,
    paging: tuple[int, int],
    timeout: float,
) -> Page:
    """The rows under the WHERE clause ``where`` counted, and the page ``paging = (page, size)`` of them (clamped to
    the pages there are) in the order ``order``, each query within ``timeout`` seconds."""
    page, size = paging
    counted = f"SELECT count(*) AS n FROM ({FILTERABLE}) WHERE {where}"
    total = _scoped(lake, counted, run_id, iteration, params, timeout)
    count = int(total["n"][0].as_py())
    pages = max(1, math.ceil(count / size))
    page = min(max(page, 0), pages - 1)
    rows = _scoped(
        lake,
        f"SELECT {TRAJECTORY_COLUMNS} FROM ({FILTERABLE}) WHERE {where} "
        f"ORDER BY {order}, split, env, group_id, traj_index LIMIT ? OFFSET ?",
        run_id,
        iteration,
        [*params, size, page * size],
        timeout,
    )
    return Page(_rows(rows), count, page, pages)


_QUOTE = re.compile(r"^LINE (\d+): ")  # DuckDB's quote of the failing line, a caret line under it


def placed(exc: duckdb.Error, where: str, text: str) -> duckdb.Error:
    """``exc`` (a query whose WHERE clause ``where`` holds the user's filter ``text`` on lines of its own) with
    DuckDB's quote of the failing line, and the caret under it, told as a place in ``text``: its line and column, or
    its end (the parenthesis that closes it). The same class of error, so callers tell them apart as before."""
    lines = str(exc).splitlines()
    first = where[: where.index(f"(\n{text}\n)")].count("\n") + 2  # the statement's line of the filter's first
    own = text.splitlines()
    for index, line in enumerate(lines[:-1]):
        quoted, caret = _QUOTE.match(line), lines[index + 1]
        if not quoted or not caret.strip() or set(caret.strip()) != {"^"}:
            continue
        number = int(quoted.group(1)) - first + 1  # the line of the filter
        head = [part.strip() for part in lines[:index] if part.strip()]
        if number > len(own):
            head[:1] = [re.sub(r' at or near "\)"$', "", part) for part in head[:1]]
            said = "at the end of the filter"
        else:
            snippet, offset = line[quoted.end() :], caret.index("^") - quoted.end()
            if snippet.startswith("..."):  # DuckDB cut the line's start: find where its quote begins
                offset += max(own[number - 1].find(snippet[3:].removesuffix("...")), 0) - 3
            said = f"at line {number}, column {offset + 1} of the filter"
        rest = "".join("\n" + part for part in lines[index + 2 :])
        return type(exc)(f"{' '.join(head)} ({said}){rest}")
    return exc


def trajectory(
    lake: DataLake, run_id: str, iteration: int, split: str, env: str, group_id: int, traj_index: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The trajectory's row (its tokens included) and its turns in order."""
    key = "split = ? AND env = ? AND group_id = ? AND traj_index = ?"
    params = [split, env, group_id, traj_index]
    found = _rows(_scoped(lake, f"SELECT * FROM ({FILTERABLE}) WHERE {key}", run_id, iteration, params))
    if not found:
        raise NotFound(
            f"run {run_id!r} has no {split} trajectory {group_id}/{traj_index} of env {env!r} in iteration {iteration}"
        )
    turns = _rows(_scoped(lake, f"SELECT * FROM turns WHERE {key} ORDER BY turn_index", run_id, iteration, params))
    return found[0], turns


def same_instance(lake: DataLake, run_id: str, split: str, env: str, group_id: int, traj_index: int) -> list[int]:
    """The iterations of the run that hold a trajectory of this key (a validation instance: the run replays the same
    ones at each validation), sorted."""
    table = query(
        lake,
        "SELECT DISTINCT iteration FROM trajectories WHERE split = ? AND env = ? AND group_id = ? AND traj_index = ? "
        "ORDER BY iteration",
        run_id=run_id,
        params=[split, env, group_id, traj_index],
        tables=("trajectories",),
    )
    return table["iteration"].to_pylist()


def same_seed(lake: DataLake, env: str, env_seed: int, limit: int = 200) -> list[dict[str, Any]]:
    """Trajectories of every run and iteration that played the same env instance (env and seed): how the policy's
    play of one room changed. It reads the trajectories of the whole lake (their key columns only)."""
    return _rows(
        query(
            lake,
            "SELECT run_id, iteration, split, env, group_id, traj_index, success, total_reward, num_turns, truncated "
            "FROM trajectories WHERE env = ? AND env_seed = ? ORDER BY run_id, iteration, split, group_id, traj_index "
            "LIMIT ?",
            params=[env, env_seed, limit],
            tables=("trajectories",),
        )
    )
