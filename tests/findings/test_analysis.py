"""The pure parts of the findings: collapse detection, spread over seeds, lead times, and the spec registry."""

from __future__ import annotations

import math

import pytest

from ragen_core.findings import FindingError, claims, load_finding, plan_finding, registered, spread
from ragen_core.findings.analysis import collapse_iteration
from ragen_core.findings.studies import _leads

DROP, CONVERGED, WINDOW = 0.25, 0.9, 3


def _series(values: list[float]) -> list[tuple[int, float]]:
    return list(enumerate(values))


def test_spread_is_the_sample_std_over_finite_values():
    result = spread([0.2, 0.4, None, float("nan"), 0.9])
    mean = (0.2 + 0.4 + 0.9) / 3
    std = math.sqrt(((0.2 - mean) ** 2 + (0.4 - mean) ** 2 + (0.9 - mean) ** 2) / 2)
    assert result == pytest.approx({"mean": mean, "std": std, "min": 0.2, "max": 0.9, "n": 3})
    assert spread([0.5]) == {"mean": 0.5, "std": 0.0, "min": 0.5, "max": 0.5, "n": 1}
    assert spread([None])["mean"] is None and spread([])["n"] == 0


def test_a_drop_of_the_trailing_mean_below_its_peak_is_a_collapse():
    success = _series([0.5, 0.6, 0.7, 0.8, 0.8, 0.6, 0.4, 0.3, 0.2])
    stds = _series([0.3] * 9)
    # trailing means (window 3) from iteration 2: .6, .7, .7667, .7333, .6, .4333 -> peak .7667 (it 4); it 7: .4333
    # is .333 below it (>= .25); it 6: .6 is only .167 below
    assert collapse_iteration(success, stds, DROP, CONVERGED, WINDOW) == 7


def test_group_std_reaching_zero_after_exploring_is_a_collapse_unless_converged():
    success = _series([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert collapse_iteration(success, _series([0.3, 0.2, 0.0, 0.0, 0.0, 0.0]), DROP, CONVERGED, WINDOW) == 2
    assert collapse_iteration(success, _series([0.3, 0.0, 0.0, 0.1, 0.0, 0.0]), DROP, CONVERGED, WINDOW) is None
    never_explored = _series([0.0] * 6)
    assert collapse_iteration(success, never_explored, DROP, CONVERGED, WINDOW) is None
    converged = _series([0.5, 0.7, 0.95, 0.95, 0.95, 0.95])
    assert collapse_iteration(converged, _series([0.3, 0.2, 0.0, 0.0, 0.0, 0.0]), DROP, CONVERGED, WINDOW) is None


def test_leads_count_warnings_at_or_before_the_collapse_and_alarms_on_healthy_runs():
    warnings = {"a": [(3, "actor/entropy"), (6, "x")], "b": [(9, "x")], "c": [], "d": [(2, "x"), (4, "y")]}
    result = _leads(warnings, {"a": 7, "b": 5, "c": None, "d": None})
    assert result["lead_iterations"] == {"a": 4, "b": None}  # b warned only after its collapse
    assert result["detected"] == 1 and result["lead"]["mean"] == 4
    assert result["false_alarm_runs"] == 1 and result["false_alarm_rate"] == 0.5
    assert result["warnings_on_healthy_runs"] == {"c": 0, "d": 2}


def test_the_registry_lists_the_specs_and_refuses_other_names():
    names = set(registered())
    assert {"echo_trap", "early_warnings", "filtering", "diversity", "reasoning", "multiturn_learning"} <= names
    assert all(claims()[name] for name in names)
    for bad in ("nope", "../configs/bandit", "echo_trap.yaml", "ECHO_TRAP", ""):
        with pytest.raises(FindingError, match="unknown finding"):
            load_finding(bad)


def test_variants_switch_the_preset_before_the_config_is_resolved():
    plans = plan_finding(load_finding("echo_trap"))
    algorithms = {item.variant.name: item.plan.points[0].config.to_dict()["algorithm"] for item in plans}
    assert algorithms["starpo"]["filter_ratio"] == 1.0 and algorithms["starpo"]["kl_coef"] == 0.001
    assert algorithms["starpo_s"]["filter_ratio"] == 0.25 and algorithms["starpo_s"]["clip_high"] == 0.28
    assert [[p.overrides for p in item.plan.points] for item in plans] == [[["seed=0"], ["seed=1"], ["seed=2"]]] * 2
    again = plan_finding(load_finding("echo_trap"))
    assert [item.plan.sweep_id for item in again] == [item.plan.sweep_id for item in plans]  # same runs: resumable
    quick = plan_finding(load_finding("echo_trap"), quick=True)
    assert all(item.plan.sweep_id.startswith("echo-trap-quick-") for item in quick)
    assert quick[0].plan.points[0].config.trainer.iterations == 3


def test_a_spec_with_a_bad_key_or_analysis_is_refused(tmp_path):
    (tmp_path / "x.yaml").write_text("finding: {claim: c, analysis: nothing}\n")
    (tmp_path / "y.yaml").write_text("finding: {claim: c, analysis: echo_trap, colour: red}\n")
    (tmp_path / "plain.yaml").write_text("seed: 1\n")  # a config, not a finding
    assert set(registered(tmp_path)) == {"x", "y"}
    with pytest.raises(FindingError, match="analysis must be one of"):
        load_finding("x", tmp_path)
    with pytest.raises(FindingError, match="unknown key"):
        load_finding("y", tmp_path)


def test_async_staleness_reads_wall_time_from_time_step_and_staleness_from_the_rows(tmp_path):
    """Two arms of two seeds each, their metrics and training rows made by hand: wall minutes are the sum of
    time/step (not of the overlapping stage timings), the gain is per wall minute, staleness from policy_version."""
    import pandas as pd

    from ragen_core.findings.analysis import Arm, Context
    from ragen_core.findings.studies import async_staleness
    from ragen_core.storage import DataLake
    from tests.storage.synthetic import Trajectory, make_run, write_run

    class Stale(Trajectory):  # sampled by the policy one update older, from iteration 1 on
        def row(self):
            return {**super().row(), "policy_version": max(self.iteration - 1, 0)}

    lake = DataLake(tmp_path)
    steps = {"s0": [10.0, 20.0], "s1": [30.0, 30.0], "a0": [6.0, 6.0], "a1": [9.0, 3.0]}
    success = {"s0": (0.2, 0.5), "s1": (0.3, 0.4), "a0": (0.2, 0.6), "a1": (0.1, 0.4)}
    rows = []
    for seed, run_id in enumerate(steps):
        run = make_run(seed, run_id, "bandit", iterations=2, groups=2, group_size=2)
        if run_id.startswith("a"):  # the async arm's batches
            for t in run.trajectories:
                t.__class__ = Stale
        write_run(lake, run)
        first, final = success[run_id]
        rows += [(run_id, 0, "val/bandit/success", first), (run_id, 2, "val/bandit/success", final)]
        rows += [(run_id, i + 1, "time/step", v) for i, v in enumerate(steps[run_id])]
        rows += [(run_id, i, "time/generate", 100.0) for i in range(3)]  # overlapping stages: never the wall
    frame = pd.DataFrame(rows, columns=["run_id", "iteration", "name", "value"])
    arms = [Arm("sync", "sync", [], ["s0", "s1"], None), Arm("k1", "k1", [], ["a0", "a1"], None)]
    numbers = async_staleness(Context(lake, arms, frame, {}, "bandit", {}))["arms"]
    assert numbers["sync"]["wall_minutes"]["mean"] == pytest.approx(((30 + 60) / 2) / 60)
    assert numbers["k1"]["seconds_per_iteration"]["mean"] == pytest.approx((6 + 6) / 2)
    gains = [(0.5 - 0.2) / 0.5, (0.4 - 0.3) / 1.0]
    assert numbers["sync"]["success_gain_per_minute"]["mean"] == pytest.approx(sum(gains) / 2)
    assert numbers["sync"]["staleness_mean"]["mean"] == 0 and numbers["sync"]["staleness_max"] == 0
    # two training iterations of equal batches: staleness 0 at iteration 0, 1 at iteration 1
    assert numbers["k1"]["staleness_mean"]["mean"] == pytest.approx(0.5) and numbers["k1"]["staleness_max"] == 1
    # the sync arm's final success spans 0.4..0.5: k1's mean 0.5 lies within it
    assert numbers["k1"]["within_sync_spread"] is True and numbers["sync"]["within_sync_spread"] is True
