"""Sweep planning (grid, random, seeds, validation before compute, stable ids) and the comparison table, checked
against numbers computed in Python from a hand-built lake."""

from __future__ import annotations

import json
import math
import statistics
from datetime import datetime, timezone

import numpy as np
import pytest

from ragen_core.config import build_config
from ragen_core.storage import DataLake, query
from ragen_core.sweep import (
    SweepError,
    compare_sweep,
    parse_grid,
    parse_random,
    parse_seeds,
    plan_sweep,
    read_sweep,
    record_sweep,
)
from tests.storage.synthetic import make_run, write_run

STAMP = datetime(2025, 1, 1, tzinfo=timezone.utc)
BASE = {"env": {"name": "bandit"}, "trainer": {"iterations": 3}}


def test_parse_grid_reads_yaml_lists_and_scalars():
    assert parse_grid("algorithm.filter_ratio=[0.25,0.5,1.0]") == ("algorithm.filter_ratio", [0.25, 0.5, 1.0])
    assert parse_grid("algorithm.filter=[std, std_rev]") == ("algorithm.filter", ["std", "std_rev"])
    assert parse_grid("rollout.group_size=8") == ("rollout.group_size", [8])
    with pytest.raises(SweepError, match="must look like key.sub=value"):
        parse_grid("filter_ratio")
    with pytest.raises(SweepError, match="no values"):
        parse_grid("algorithm.filter_ratio=[]")


def test_parse_random_checks_the_distribution_and_its_arguments():
    spec = parse_random("actor.lr=loguniform(1e-4, 1e-2)")
    assert (spec.key, spec.distribution, spec.args) == ("actor.lr", "loguniform", [1e-4, 1e-2])
    assert parse_random("algorithm.estimator=choice([grpo, gae])").args == ["grpo", "gae"]
    for bad, message in [
        ("actor.lr=normal(0,1)", "dist one of"),
        ("actor.lr=uniform(2,1)", "low <= high"),
        ("actor.lr=loguniform(0,1)", "low > 0"),
        ("rollout.group_size=randint(1.5,4)", "two integers"),
        ("actor.lr=uniform(1)", "two numbers"),
        ("actor.lr", "key=dist"),
    ]:
        with pytest.raises(SweepError, match=message):
            parse_random(bad)


def test_random_draws_stay_in_bounds_and_follow_their_distribution():
    rng = np.random.default_rng(0)
    log_draws = [parse_random("actor.lr=loguniform(1e-4,1e-2)").sample(rng) for _ in range(4000)]
    assert all(1e-4 <= v <= 1e-2 for v in log_draws)
    # log-uniform: the log10 is uniform on [-4, -2]: median -3, a quarter below -3.5 (4 sd of a binomial ~ 0.027)
    logs = np.log10(log_draws)
    assert abs(float(np.median(logs)) + 3) < 0.05
    assert abs(float(np.mean(logs < -3.5)) - 0.25) < 0.03
    ints = [parse_random("rollout.group_size=randint(2,4)").sample(rng) for _ in range(3000)]
    assert set(ints) == {2, 3, 4}  # both ends included
    assert all(abs(ints.count(v) / 3000 - 1 / 3) < 0.04 for v in (2, 3, 4))


def test_parse_seeds():
    assert parse_seeds(3) == [0, 1, 2]
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("0,7,42") == [0, 7, 42]
    assert parse_seeds(None) == []
    with pytest.raises(SweepError, match="distinct"):
        parse_seeds("1,1")
    with pytest.raises(SweepError, match="count"):
        parse_seeds("a,b")


def test_grid_times_seeds_gives_every_combination_as_its_own_validated_run():
    plan = plan_sweep(BASE, ["algorithm.filter_ratio=[0.25,0.5,1.0]", "algorithm.filter=[std,std_rev]"], seeds=2)
    assert len(plan.points) == 12
    assert [p.run_id for p in plan.points] == [f"{plan.sweep_id}-p{i:03d}" for i in range(12)]
    assert plan.points[0].overrides == ["algorithm.filter_ratio=0.25", 'algorithm.filter="std"', "seed=0"]
    assert plan.points[11].overrides == ["algorithm.filter_ratio=1.0", 'algorithm.filter="std_rev"', "seed=1"]
    combos = {(p.config.algorithm.filter_ratio, p.config.algorithm.filter, p.config.seed) for p in plan.points}
    assert combos == {(r, f, s) for r in (0.25, 0.5, 1.0) for f in ("std", "std_rev") for s in (0, 1)}
    for point in plan.points:  # every point is a complete, valid config equal to base + its overrides
        assert point.config == build_config(BASE, point.overrides)
        assert point.config.trainer.iterations == 3


def test_the_sweep_id_follows_the_spec():
    first = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], seeds=2)
    again = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], seeds=2)
    other = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], seeds=3)
    other_base = plan_sweep({**BASE, "trainer": {"iterations": 4}}, ["algorithm.filter_ratio=[0.5,1.0]"], seeds=2)
    assert first.sweep_id == again.sweep_id and first.points == again.points
    assert len({first.sweep_id, other.sweep_id, other_base.sweep_id}) == 3
    assert plan_sweep(BASE, seeds=2, sweep_id="mine").points[1].run_id == "mine-p001"
    with pytest.raises(SweepError, match="letters, digits"):
        plan_sweep(BASE, seeds=2, sweep_id="a/b")


def test_random_search_draws_per_grid_combination_reproducibly():
    plan = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], ["actor.lr=loguniform(1e-4,1e-2)"], samples=3)
    assert len(plan.points) == 6
    lrs = [p.config.actor.lr for p in plan.points]
    assert len(set(lrs)) == 6 and all(1e-4 <= lr <= 1e-2 for lr in lrs)
    again = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], ["actor.lr=loguniform(1e-4,1e-2)"], samples=3)
    assert [p.config.actor.lr for p in again.points] == lrs
    other = plan_sweep(
        BASE, ["algorithm.filter_ratio=[0.5,1.0]"], ["actor.lr=loguniform(1e-4,1e-2)"], samples=3, search_seed=1
    )
    assert [p.config.actor.lr for p in other.points] != lrs
    assert other.sweep_id != plan.sweep_id
    for point in plan.points:  # the override text reads back as exactly the drawn float
        assert float(point.overrides[1].split("=", 1)[1]) == point.config.actor.lr


def test_a_bad_point_is_refused_before_anything_runs():
    expected = r"(?s)point 1 \(algorithm.filter_ratio=1.5\).*filter_ratio=1.5: filter std needs a value in \(0, 1\]"
    with pytest.raises(SweepError, match=expected):
        plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.5]"])
    with pytest.raises(SweepError, match="unknown key"):
        plan_sweep(BASE, ["algorithm.filtr_ratio=[0.5]"])
    with pytest.raises(SweepError, match="searched twice"):
        plan_sweep(BASE, ["seed=[1,2]"], seeds=2)
    with pytest.raises(SweepError, match="--samples"):
        plan_sweep(BASE, random=["actor.lr=uniform(0.001,0.01)"])


def test_a_preset_axis_is_refused_because_it_would_change_nothing():
    # what the axis would have produced: the base config (starpo_s) resolved, then preset=starpo laid on top
    resolved = plan_sweep(BASE).points[0].config.to_dict()
    assert resolved["algorithm"]["preset"] == "starpo_s" and resolved["algorithm"]["kl_coef"] == 0.0
    with pytest.raises(SweepError, match="algorithm.preset cannot be a sweep axis"):
        plan_sweep(BASE, ["algorithm.preset=[starpo,starpo_s]"])
    with pytest.raises(SweepError, match="algorithm.preset cannot be a sweep axis"):
        plan_sweep(BASE, random=["algorithm.preset=choice([starpo,starpo_s])"], samples=2)


def test_recording_a_sweep_refuses_another_spec_under_the_same_id(tmp_path):
    lake = DataLake(tmp_path)
    plan = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], sweep_id="s1")
    record_sweep(lake, plan)
    record_sweep(lake, plan)  # the same sweep again: fine (a resume)
    assert read_sweep(lake, "s1") == plan
    with pytest.raises(SweepError, match="already names another sweep"):
        record_sweep(lake, plan_sweep(BASE, ["algorithm.filter_ratio=[0.25]"], sweep_id="s1"))


def test_comparison_table_matches_the_numbers_computed_from_the_runs(tmp_path):
    lake = DataLake(tmp_path)
    plan = plan_sweep(BASE, ["algorithm.filter_ratio=[0.5,1.0]"], seeds=2, sweep_id="cmp")
    runs = {}
    for point in plan.points[:3]:  # point 3 never started
        ratio = point.config.algorithm.filter_ratio
        run = make_run(100 + point.index, point.run_id, "bandit", 3, filter_ratio=ratio)
        write_run(lake, run, status="failed" if point.index == 2 else "completed")
        manifest = lake.read_manifest(point.run_id)
        lake.write_manifest(point.run_id, manifest.updated(sweep=point.manifest_entry(plan.sweep_id)))
        runs[point.run_id] = run
    events = [
        {
            "run_id": plan.points[1].run_id,
            "iteration": i,
            "kind": kind,
            "metric": "actor/entropy",
            "value": 0.1,
            "threshold": 0.2,
            "message": "m",
            "created_at": STAMP,
        }
        for i, kind in ((1, "early_warning"), (2, "early_warning"), (2, "info"))
    ]
    for iteration in (1, 2):
        rows = [e for e in events if e["iteration"] == iteration]
        lake.write_rows("events", plan.points[1].run_id, iteration, rows, stage="commit")
    write_run(lake, make_run(7, "not-in-the-sweep", "bandit", 3))

    table = compare_sweep(lake, plan).to_pylist()
    assert [row["run_id"] for row in table] == [p.run_id for p in plan.points]
    for point, row in zip(plan.points[:3], table, strict=False):
        run = runs[point.run_id]
        val = [t for t in run.trajectories if t.split == "val"]
        last = max(t.iteration for t in val)
        expected_final = statistics.fmean(t.success for t in val if t.iteration == last)
        expected_first = statistics.fmean(t.success for t in val if t.iteration == 0)
        expected_reward = run.metrics[max(i for i in run.metrics if "rollout/reward_mean" in run.metrics[i])]
        assert math.isclose(row["val_success"], expected_final)
        assert math.isclose(row["val_success_first"], expected_first)
        assert math.isclose(row["final_reward"], expected_reward["rollout/reward_mean"])
        assert row["overrides"] == " ".join(point.overrides)
        assert row["iterations_done"] == 4
    assert [row["status"] for row in table] == ["completed", "completed", "failed", "pending"]
    assert [row["collapse_events"] for row in table] == [0, 2, 0, 0]  # 'info' events are not collapse warnings
    assert table[3]["val_success"] is None and table[3]["iterations_done"] == 0
    # and the runs table carries the sweep columns for SQL users
    rows = query(lake, "SELECT run_id, sweep_id, sweep_point, overrides_json FROM runs ORDER BY run_id").to_pylist()
    swept = {r["run_id"]: r for r in rows if r["sweep_id"] == "cmp"}
    assert set(swept) == {p.run_id for p in plan.points[:3]}
    assert json.loads(swept[plan.points[2].run_id]["overrides_json"]) == plan.points[2].overrides
    assert swept[plan.points[2].run_id]["sweep_point"] == 2
    assert next(r for r in rows if r["run_id"] == "not-in-the-sweep")["sweep_id"] is None


def test_exponent_notation_is_a_number_even_where_yaml_reads_a_string():
    assert parse_grid("actor.lr=[1e-4, 3e-3]") == ("actor.lr", [1e-4, 3e-3])
    assert parse_random("actor.lr=uniform(1e-4,2E-3)").args == [1e-4, 2e-3]
    assert parse_grid("env.name=[e1]")[1] == ["e1"]
