"""docs/sql.md: the column reference matches the table specs, and every worked query returns the numbers computed
independently in Python over a lake written through the real lake API."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ragen_core.run.offline import lineage
from ragen_core.storage import DataLake, check_read_only, query
from ragen_core.storage.sqldoc import COLUMNS_BEGIN, named_queries, update_columns
from schemas.manifest import RunManifest
from schemas.tables import TABLES
from tests.storage.synthetic import PROMPT_TOKENS, SyntheticRun, Trajectory, make_run, write_run

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
RUNS = (
    ("sweep-a", "sokoban", 0.5),
    ("sweep-b", "sokoban", 1.0),
    ("bandit-demo", "bandit", 0.5),
    ("tools-demo", "calculator", 1.0),
)
# offline runs (ragen retrain): mode, (source run, first iteration taken) pairs, start model (a run's checkpoint or
# a model folder outside the data root)
OFFLINE = (
    ("offline-pg", "pg", (("sweep-b", 0),), ("sweep-a", 2)),
    ("offline-sft", "sft", (("sweep-a", 1), ("bandit-demo", 0)), None),
    ("offline-unrelated", "sft", (("bandit-demo", 2),), ("sweep-b", 1)),
)


def _offline_selection(runs: list[SyntheticRun], sources: tuple) -> list[Trajectory]:
    """The trajectories an offline run of OFFLINE selected: train rows of each source from its first iteration."""
    first = dict(sources)
    return [
        t
        for run in runs
        if run.run_id in first
        for t in run.trajectories
        if t.split == "train" and t.iteration >= first[run.run_id]
    ]


def _write_offline_runs(lake: DataLake, runs: list[SyntheticRun]) -> None:
    """Manifests of offline runs whose lineage is made by the code `ragen retrain` uses (ragen_core.run.offline)."""
    for run_id, mode, sources, init in OFFLINE:
        chosen = _offline_selection(runs, sources)
        table = pa.table({"run_id": [t.run_id for t in chosen], "iteration": [t.iteration for t in chosen]})
        init_dir = lake.root.parent / "base-model"
        if init is not None:
            init_dir = lake.root / "runs" / init[0] / "checkpoints" / f"iteration={init[1]}" / "hf"
        sql = f"SELECT * FROM trajectories WHERE split = 'train' -- {run_id}"
        manifest = RunManifest(
            run_id=run_id,
            kind="offline",
            status="completed",
            config={},
            created_at="2025-02-01T00:00:00+00:00",
            lineage=lineage(sql, table, mode, init_dir, lake),
        )
        lake.write_manifest(run_id, manifest)


@pytest.fixture(scope="module")
def lake_runs(tmp_path_factory) -> tuple[DataLake, list[SyntheticRun]]:
    lake = DataLake(tmp_path_factory.mktemp("docs-lake"))
    runs = [make_run(11 + i, run_id, env, 3, filter_ratio=ratio) for i, (run_id, env, ratio) in enumerate(RUNS)]
    for run in runs:
        write_run(lake, run)
    for point, run in enumerate(runs[:2]):  # sweep-a and sweep-b are the two points of sweep 'sweep-x'
        overrides = [f"algorithm.filter_ratio={run.config['algorithm']['filter_ratio']}"]
        manifest = lake.read_manifest(run.run_id)
        sweep = {"id": "sweep-x", "point": point, "overrides": overrides}
        lake.write_manifest(run.run_id, manifest.updated(sweep=sweep))
    _write_offline_runs(lake, runs)
    return lake, runs


def _by(items: Iterable, key: Callable) -> list[tuple]:
    grouped = defaultdict(list)
    for item in items:
        grouped[key(item)].append(item)
    return sorted(grouped.items())


def _trajectories(runs: list[SyntheticRun]) -> list[Trajectory]:
    return [t for run in runs for t in run.trajectories]


def _turns(runs: list[SyntheticRun]) -> list[tuple[Trajectory, int, object]]:
    return [(t, i, turn) for t in _trajectories(runs) for i, turn in enumerate(t.turns)]


def success_by_env_iteration(runs):
    return [
        {
            "run_id": k[0],
            "env": k[1],
            "split": k[2],
            "iteration": k[3],
            "trajectories": len(ts),
            "success_rate": statistics.fmean(t.success for t in ts),
            "mean_reward": statistics.fmean(t.total_reward for t in ts),
        }
        for k, ts in _by(_trajectories(runs), lambda t: (t.run_id, t.env, t.split, t.iteration))
    ]


def reward_by_turn(runs):
    train = [(t, i, turn) for t, i, turn in _turns(runs) if t.split == "train"]
    rows = []
    for (env, index), group in _by(train, lambda x: (x[0].env, x[1])):
        rewards = [turn.reward for _, _, turn in group]
        rows.append(
            {
                "env": env,
                "turn_index": index,
                "turns": len(rewards),
                "mean_reward": statistics.fmean(rewards),
                "reward_std": statistics.pstdev(rewards),
                "min_reward": min(rewards),
                "median_reward": statistics.median(rewards),
                "max_reward": max(rewards),
            }
        )
    return rows


def echo_trap_think_diversity(runs):
    train = [(t, turn) for t, _, turn in _turns(runs) if t.split == "train"]
    groups = _by(train, lambda x: (x[0].run_id, x[0].iteration, x[0].env, x[0].group_id))
    per_group = [(k, len({turn.think for _, turn in g}), len(g)) for k, g in groups]
    return [
        {
            "run_id": k[0],
            "iteration": k[1],
            "distinct_thinks_per_group": statistics.fmean(d for _, d, _ in gs),
            "distinct_share": statistics.fmean(d / n for _, d, n in gs),
        }
        for k, gs in _by(per_group, lambda x: x[0][:2])
    ]


def format_failures(runs):
    rows = []
    for t in sorted(_trajectories(runs), key=lambda t: t.key):
        bad = [turn for turn in t.turns if not turn.format_ok]
        if bad:
            rows.append(
                {
                    "run_id": t.run_id,
                    "iteration": t.iteration,
                    "split": t.split,
                    "env": t.env,
                    "group_id": t.group_id,
                    "traj_index": t.traj_index,
                    "num_turns": len(t.turns),
                    "format_penalty": t.format_penalty,
                    "bad_turns": len(bad),
                    "bad_replies": [turn.response for turn in bad],
                }
            )
    return rows


def filter_keep_rate(runs):
    train = [t for t in _trajectories(runs) if t.split == "train"]
    groups = [(k, g[0].kept, g[0].group_reward_std) for k, g in _by(train, lambda t: t.key[:5])]
    rows = []
    for (run_id, iteration), gs in _by(groups, lambda x: x[0][:2]):
        kept = [std for _, keep, std in gs if keep]
        dropped = [std for _, keep, std in gs if not keep]
        rows.append(
            {
                "run_id": run_id,
                "iteration": iteration,
                "groups": len(gs),
                "keep_rate": len(kept) / len(gs),
                "kept_reward_std": statistics.fmean(kept) if kept else None,
                "dropped_reward_std": statistics.fmean(dropped) if dropped else None,
            }
        )
    return rows


def sokoban_solution_plans(runs):
    plans = Counter(
        tuple(a for turn in t.turns for a in turn.actions)
        for t in _trajectories(runs)
        if t.env == "sokoban" and t.success
    )
    rows = [{"actions": " ".join(p), "steps": len(p), "solves": n} for p, n in plans.items()]
    return sorted(rows, key=lambda r: (-r["solves"], r["actions"]))[:10]


def response_length_by_iteration(runs):
    return [
        {
            "run_id": k[0],
            "split": k[1],
            "iteration": k[2],
            "mean_tokens": statistics.fmean(t.response_length for t in ts),
            "max_tokens": max(t.response_length for t in ts),
            "truncated_share": 0.0,
            "mean_sequence_length": statistics.fmean(PROMPT_TOKENS + t.response_length for t in ts),
        }
        for k, ts in _by(_trajectories(runs), lambda t: (t.run_id, t.split, t.iteration))
    ]


def compare_sweep_runs(runs):
    a, b = runs[0], runs[1]

    def success(run: SyntheticRun, iteration: int) -> float:
        return statistics.fmean(t.success for t in run.trajectories if t.split == "val" and t.iteration == iteration)

    ratio_a, ratio_b = a.config["algorithm"]["filter_ratio"], b.config["algorithm"]["filter_ratio"]
    return [
        {
            "iteration": i,
            "env": "sokoban",
            "filter_ratio_a": ratio_a,
            "success_a": success(a, i),
            "filter_ratio_b": ratio_b,
            "success_b": success(b, i),
            "difference": success(b, i) - success(a, i),
        }
        for i in sorted(a.metrics)
    ]


def sweep_points(runs):
    rows = []
    for point, run in enumerate(runs[:2]):
        last = max(t.iteration for t in run.trajectories if t.split == "val")
        success = statistics.fmean(t.success for t in run.trajectories if t.split == "val" and t.iteration == last)
        rows.append(
            {
                "sweep_point": point,
                "run_id": run.run_id,
                "overrides_json": f'["algorithm.filter_ratio={run.config["algorithm"]["filter_ratio"]}"]',
                "env": run.env,
                "iteration": last,
                "success_rate": success,
            }
        )
    return rows


def training_curves(runs):
    return [
        {
            "run_id": run.run_id,
            "iteration": i,
            "reward_mean": run.metrics[i].get("rollout/reward_mean"),
            "val_success": run.metrics[i][f"val/{run.env}/success"],
        }
        for run in sorted(runs, key=lambda r: r.run_id)
        for i in sorted(run.metrics)
    ]


def trained_tokens(runs):
    kept = [t for t in _trajectories(runs) if t.split == "train" and t.kept]
    rows = []
    for (run_id, iteration), ts in _by(kept, lambda t: (t.run_id, t.iteration)):
        tokens = sum(t.response_length for t in ts)
        # stored as float32 (the schema), summed by DuckDB: compared to 1e-6 (TOLERANCE)
        logprob = math.fsum(float(np.float32(lp)) for t in ts for lp in t.row()["behavior_logprobs"])
        rows.append(
            {
                "run_id": run_id,
                "iteration": iteration,
                "kept_trajectories": len(ts),
                "trained_tokens": tokens,
                "mean_behavior_logprob": logprob / tokens,
            }
        )
    return rows


def vertical_move_share(runs):
    sokoban = [(t, turn) for t, _, turn in _turns(runs) if t.env == "sokoban"]
    rows = []
    for (env, split), group in _by(sokoban, lambda x: (x[0].env, x[0].split)):
        actions = [a for _, turn in group for a in turn.actions]
        rows.append(
            {"env": env, "split": split, "vertical_share": sum(a in ("Up", "Down") for a in actions) / len(actions)}
        )
    return rows


def runs_trained_from(runs, source: str = "sweep-a"):
    """Offline runs trained on ``source``'s trajectories (the iterations taken) or started from its checkpoint."""
    rows = []
    for run_id, mode, sources, init in sorted(OFFLINE):
        used = sorted({t.iteration for t in _offline_selection(runs, sources) if t.run_id == source}) or None
        from_checkpoint = init is not None and init[0] == source
        if used or from_checkpoint:
            rows.append(
                {
                    "run_id": run_id,
                    "offline_mode": mode,
                    "iterations_used": used,
                    "started_from_its_checkpoint": from_checkpoint,
                    "init_iteration": init[1] if init is not None else None,
                }
            )
    return rows


def teacher_agreement(runs):
    """Per run, iteration and env: the share of validation turns whose first action is one of the teacher's, the
    chance share and the turns counted (turns of envs with a teacher only)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        for t in run.trajectories:
            if t.split == "val":
                for i in range(len(t.turns)):
                    if t.teacher(i) is not None:
                        groups[(t.run_id, t.iteration, t.env)].append(t.turn_info(i))
    return [
        {
            "run_id": r,
            "iteration": i,
            "env": e,
            "agreement": statistics.fmean(float(x["teacher_agree"]) for x in infos),
            "chance": statistics.fmean(x["teacher_chance"] for x in infos),
            "turns": len(infos),
        }
        for (r, i, e), infos in sorted(groups.items())
    ]


def tool_failures(runs):
    """Per tool (None for calls that did not parse), turn index and policy version of the training turns: the calls,
    the tools' failures (raised, timeout) and every call with an error; the most failures first."""
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for t in _trajectories(runs):
        if t.split != "train":
            continue
        for index, turn in enumerate(t.turns):
            for call in turn.tool_calls or []:
                row = counts[(call["name"], index, t.iteration)]  # policy_version = iteration in these runs
                row[0] += 1
                row[1] += call["error"] in ("raised", "timeout")
                row[2] += call["error"] is not None
    order = sorted(counts.items(), key=lambda kv: (-kv[1][1], -kv[1][2], kv[0][0] is None, kv[0][0] or "", *kv[0][1:]))
    return [
        {"tool": k[0], "turn_index": k[1], "policy_version": k[2], "calls": v[0], "failures": v[1], "errors": v[2]}
        for k, v in order
    ]


EXPECTED = {
    f.__name__: f
    for f in (
        success_by_env_iteration,
        reward_by_turn,
        echo_trap_think_diversity,
        format_failures,
        filter_keep_rate,
        sokoban_solution_plans,
        response_length_by_iteration,
        compare_sweep_runs,
        training_curves,
        trained_tokens,
        vertical_move_share,
        sweep_points,
        runs_trained_from,
        teacher_agreement,
        tool_failures,
    )
}


TOLERANCE = {"trained_tokens": 1e-6}


def _assert_rows_equal(actual: list[dict], expected: list[dict], rel: float = 1e-9) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert list(got) == list(want), (got, want)
        for column, value in want.items():
            if isinstance(value, float):
                assert got[column] == pytest.approx(value, rel=rel, abs=1e-12), (column, got, want)
            else:
                assert got[column] == value, (column, got, want)


def test_the_page_lists_every_column_of_every_table():
    text = DOC.read_text()
    assert update_columns(text) == text, "stale column reference: run python -m ragen_core.storage.sqldoc docs/sql.md"
    reference = text.split(COLUMNS_BEGIN, 1)[1]
    for name, spec in TABLES.items():
        section = reference.split(f"### `{name}`", 1)[1].split("### ", 1)[0]
        for column in spec.columns:
            assert f"| `{column.name}` |" in section, (name, column.name)


def test_every_worked_query_is_tested_and_read_only():
    queries = named_queries(DOC.read_text())
    assert len(queries) >= 8 and list(queries) == list(EXPECTED)
    for sql in queries.values():
        check_read_only(sql)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_worked_query_returns_the_independently_computed_numbers(lake_runs, name):
    lake, runs = lake_runs
    expected = EXPECTED[name](runs)
    assert expected, f"the generated lake gives {name} nothing to find"
    actual = query(lake, named_queries(DOC.read_text())[name]).to_pylist()
    _assert_rows_equal(actual, expected, TOLERANCE.get(name, 1e-9))


@pytest.mark.parametrize("source", ["sweep-a", "sweep-b", "bandit-demo", "offline-sft"])
def test_lineage_query_takes_the_run_id_as_a_parameter(lake_runs, source):
    """The lineage query as its section says to use it from Python: ``$run_id`` for each ``'sweep-a'`` and the id as
    a parameter, for every run (one that is only a start model, one that is only a source, one nothing came from)."""
    lake, runs = lake_runs
    sql = named_queries(DOC.read_text())["runs_trained_from"]
    assert sql.count("'sweep-a'") >= 2
    actual = query(lake, sql.replace("'sweep-a'", "$run_id"), params={"run_id": source}).to_pylist()
    _assert_rows_equal(actual, runs_trained_from(runs, source))
    assert bool(actual) == (source != "offline-sft")
