"""The benchmark harness itself: interleaving, spreads, the overhead and time-ratio definitions, and a tiny real
run of the rollout and update sections writing results.json and RESULTS.md."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks.common import interleave, spread
from benchmarks.flow_bench import memory_summary, overhead_summary
from benchmarks.report import REQUIRED_KEYS


def test_interleave_alternates_the_order_every_repeat():
    calls: list[str] = []
    timings = interleave({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, repeats=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [result for _, result in timings["a"]] == [1, 1, 1] and len(timings["b"]) == 3
    assert all(seconds >= 0 for seconds, _ in timings["a"] + timings["b"])
    with pytest.raises(ValueError, match="at least 1"):
        interleave({"a": lambda: None}, repeats=0)


def test_spread_by_hand():
    assert spread([2.0, 1.0, 4.0]) == {"median": 2.0, "min": 1.0, "max": 4.0, "n": 3, "rel_spread": 1.5}


def _row(iteration, wall, core, stages, evaluated=False, parquet=0.0):
    return {
        "iteration": iteration,
        "wall_s": wall,
        "core_s": sum(core.values()),
        "core": core,
        "stage_s": stages,
        "evaluated": evaluated,
        "parquet_write_s": parquet,
        "peak_rss_bytes": 100 + iteration,
    }


def test_overhead_is_wall_minus_core_over_wall_on_iterations_without_validation():
    rows = [
        _row(0, 10.0, {"evaluate": 5.0, "generate_rollouts": 1.0}, {"evaluate": 5.5, "generate": 1.5}, True),
        _row(1, 4.0, {"generate_rollouts": 1.0, "update_policy": 2.0}, {"generate": 1.2, "update": 2.3}, parquet=0.2),
        _row(2, 5.0, {"generate_rollouts": 2.0, "update_policy": 2.0}, {"generate": 2.1, "update": 2.4}, parquet=0.1),
    ]
    summary = overhead_summary(rows)
    assert summary["overhead_share"]["n"] == 2  # the validating iteration is left out
    assert summary["overhead_share"]["median"] == pytest.approx(statistics.median([1.0 / 4.0, 1.0 / 5.0]))
    assert summary["overhead_share_all_iterations"] == pytest.approx((19.0 - 13.0) / 19.0)
    assert summary["subflow_and_glue_s"]["median"] == pytest.approx(statistics.median([0.5, 0.5]))
    assert summary["task_wrappers_s"]["median"] == pytest.approx(statistics.median([0.5, 0.5]))
    assert summary["parquet_write_share"]["median"] == pytest.approx(statistics.median([0.05, 0.02]))
    memory = memory_summary(rows, early=2)
    assert memory["peak_rss_growth"] == pytest.approx((102 - 101) / 101)


def test_validation_share_is_the_validate_core_call_over_wall_on_iterations_without_validation():
    rows = [
        _row(0, 10.0, {"validate": 4.0, "evaluate": 5.0}, {"validate": 4.1, "evaluate": 5.5}, True),
        _row(1, 4.0, {"validate": 0.4, "update_policy": 2.0}, {"validate": 0.5, "update": 2.3}),
        _row(2, 5.0, {"validate": 0.25, "update_policy": 2.0}, {"validate": 0.3, "update": 2.4}),
        _row(3, 2.0, {"update_policy": 1.0}, {"update": 1.1}),  # validation not timed: a share of 0
    ]
    share = overhead_summary(rows)["validation_share"]
    assert share["n"] == 3 and share["median"] == pytest.approx(0.05)  # of 0.4 / 4, 0.25 / 5, 0
    assert (share["min"], share["max"]) == (pytest.approx(0.0), pytest.approx(0.1))


def test_trl_time_ratio_is_ours_over_trl_without_our_validation():
    from benchmarks.trl_bench import summarise

    class Config:
        class env:  # noqa: N801 - mirrors the config's attribute names
            name = "bandit"

        class trainer:  # noqa: N801
            iterations = 3

        class algorithm:  # noqa: N801
            filter_ratio = 1.0

    rows = [
        {
            "iteration": 0,
            "wall_s": 6.0,
            "stage_s": {"evaluate": 2.0},
            "evaluated": True,
            "metrics": {"val/bandit/success": 0.5},
        },
        {"iteration": 1, "wall_s": 5.0, "stage_s": {}, "evaluated": False, "metrics": {}},
        {"iteration": 2, "wall_s": 3.0, "stage_s": {}, "evaluated": False, "metrics": {}},
    ]
    result = summarise(Config, rows, {"val/bandit/success": 0.75}, [2.0, 2.0, 4.0], {0: 0.5, 3: 1.0}, True, 8)
    assert result["trl_iteration_time_ratio"] == pytest.approx(4.0 / 2.0)  # medians of [4, 5, 3] and [2, 2, 4]
    assert result["ours"]["success_gain_per_minute"] == pytest.approx(0.25 / (12.0 / 60.0))
    assert result["trl"]["success_gain_per_minute"] == pytest.approx(0.5 / (8.0 / 60.0))


@pytest.mark.slow  # the bench's quick sections: 20-50 s
def test_quick_rollout_and_update_write_the_results(tmp_path, monkeypatch):
    import torch

    from benchmarks.__main__ import main

    monkeypatch.setenv("RAGEN_BENCH_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    try:
        code = main(["--quick", "--only", "rollout,update", "--repeats", "3", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    flat = json.loads((tmp_path / "results.json").read_text())
    assert set(REQUIRED_KEYS) <= set(flat)
    assert flat["orchestration_overhead"] is None and flat["trl_iteration_time_ratio"] is None  # not run
    details = json.loads((tmp_path / "results" / "details.json").read_text())
    for section in ("rollout", "update"):
        for case in details[section]["cases"]:
            assert case["same_tokens"] is True  # both sides produced / trained the same tokens
            tokens = case["generated_tokens"][0] if section == "rollout" else case["trained_tokens"]
            ratios = [
                (tokens / ours) / (tokens / bare)
                for ours, bare in zip(case["ours_seconds"], case["bare_seconds"], strict=True)
            ]
            assert case["ratio"]["median"] == pytest.approx(statistics.median(ratios))
            assert len(ratios) == 3
    worst = min(c["ratio"]["median"] for c in details["rollout"]["cases"])
    assert flat["rollout_efficiency"] == pytest.approx(worst)
    report = (tmp_path / "RESULTS.md").read_text()
    assert "## 1. Rollout efficiency" in report and "Not run by `make bench`: this machine has no GPU" in report


def test_regenerating_the_report_keeps_other_benchmarks_sections():
    from benchmarks.__main__ import foreign_sections

    text = (
        "# old\n<!-- lake_bench:begin -->\nlake\n<!-- lake_bench:end -->\n"
        "<!-- gpu_update_bench:begin -->\n## GPU update\n| 0 | 1.0 |\n<!-- gpu_update_bench:end -->\ntrailing\n"
    )
    kept = foreign_sections(text)
    assert kept == "\n<!-- gpu_update_bench:begin -->\n## GPU update\n| 0 | 1.0 |\n<!-- gpu_update_bench:end -->\n"


def test_the_host_share_sums_the_host_parts_over_the_step():
    from benchmarks.host_bench import summary

    rows = [
        {"time/persist": 0.1, "time/validate": 0.2, "time/filter": 0.3, "inputs": 0.4, "time/step": 4.0},
        {"time/persist": 0.3, "time/validate": 0.2, "time/filter": 0.1, "inputs": 0.0, "time/step": 2.0},
    ]
    result = summary(rows)
    assert result["host_s"] == pytest.approx(0.8)  # (1.0 + 0.6) / 2
    assert result["time/step"] == pytest.approx(3.0)
    assert result["host_share"] == pytest.approx(0.8 / 3.0)


@pytest.mark.slow  # two real sessions of the tiny model and their sampler processes: ~40 s
def test_the_lora_bench_counts_trainable_parameters_and_adam_state_by_hand(tiny_model_dir):
    import torch

    from benchmarks.lora_bench import run_side
    from ragen_core.policy import load_policy

    threads = torch.get_num_threads()
    try:
        full, lora = (run_side(side, tiny_model_dir, repeats=1, threads=1) for side in ("full", "lora-8"))
    finally:
        torch.set_num_threads(threads)
    model, _ = load_policy(tiny_model_dir)
    distinct = {id(p): p.numel() for p in model.parameters()}  # the tied head and embedding once
    linear = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name != "lm_head"]
    adapters = sum(8 * (m.in_features + m.out_features) for m in linear)  # A: r x in, B: out x r
    assert full["trainable_parameters"] == sum(distinct.values())
    assert lora["trainable_parameters"] == adapters
    assert full["optimizer_state_bytes"] == 2 * 4 * sum(distinct.values())  # AdamW's two fp32 moments
    assert lora["optimizer_state_bytes"] == 2 * 4 * adapters
    assert full["trained_tokens"] == lora["trained_tokens"] > 0  # the same batch on both sides
    assert len(full["update_seconds"]) == len(lora["update_seconds"]) == 1
    # the hand-off copies every parameter, or the adapters alone, each tensor padded to 64 bytes (fp32: 16 numbers)
    padded = [-(-n // 16) * 16 for n in distinct.values()]
    pieces = [-(-(8 * m.in_features) // 16) * 16 + -(-(8 * m.out_features) // 16) * 16 for m in linear]
    assert full["handoff_bytes"] == 4 * sum(padded)
    assert lora["handoff_bytes"] == 4 * sum(pieces)
    assert len(full["handoff_seconds"]) == len(lora["handoff_seconds"]) == 1
