"""The launched-group benchmark's arithmetic and the matmul-peak share: per-repeat ratios, the flat keys."""

import pytest

from benchmarks.group_bench import GroupCase, summarise
from benchmarks.peak import update_flops, update_peak_share
from benchmarks.report import flatten


def test_group_ratios_are_per_repeat_time_over_the_in_process_time():
    timings = {
        "inprocess": [(2.0, 40), (4.0, 40), (3.0, 40)],
        "group": [(2.2, 40), (4.0, 40), (3.9, 40)],
        "export": [(3.0, 40), (5.0, 40), (6.0, 40)],
    }
    parts = {"update_s": [2.0, 3.8, 3.6], "handoff_s": [0.01] * 3, "sync_s": [0.02] * 3, "round_trip_s": []}
    result = summarise(GroupCase("tiny", 3, 1), timings, parts, {"inprocess": 1, "group": None}, 1000)
    assert result["ratio"]["median"] == pytest.approx(1.1)  # of 1.1, 1.0, 1.3
    assert result["ratio"]["min"] == pytest.approx(1.0) and result["ratio"]["max"] == pytest.approx(1.3)
    assert result["export_ratio"]["median"] == pytest.approx(1.5)  # of 1.5, 1.25, 2.0
    assert result["same_tokens"] and result["trained_tokens"] == 40
    assert "round_trip_s" not in result["group_breakdown_s"]  # nothing measured, nothing reported
    flat = flatten({"group": {"cases": [result]}})
    assert flat["launched_group_update_ratio"] == pytest.approx(1.1)
    assert flat["launched_group_update_ratio.tiny.export_handoff"] == pytest.approx(1.5)


def test_the_peak_share_is_model_flops_over_the_median_time_and_the_peak():
    assert update_flops(10, 3) == 180 and update_flops(10, 3, passes=2, rescored=True) == 420
    case = {"ours_seconds": [4.0, 1.0, 2.0], "parameters": 1_000_000, "processed_tokens": 500, "shape": "tiny"}
    share = update_peak_share(case, peak_tflops=0.003)  # 6 x 1e6 x 500 = 3e9 FLOPs in 2 s (the median)
    assert share["achieved_tflops"] == pytest.approx(1.5e-3)
    assert share["share"] == pytest.approx(0.5)
    one = {"median": 1.0, "min": 1.0, "max": 1.0}
    row = {**case, "peak_share": share, "ratio": one, "ours_tokens_per_s": one, "bare_tokens_per_s": one}
    details = {"update": {"machine": {}, "cases": [row]}}
    assert flatten(details)["update_peak_share"] == pytest.approx(0.5)
    assert flatten({})["update_peak_share"] is None and flatten({})["launched_group_update_ratio"] is None


def test_the_nodes_ratio_is_per_repeat_two_node_time_over_one_node_time():
    from benchmarks.markdown_engines import nodes_section
    from benchmarks.nodes_bench import NodesCase
    from benchmarks.nodes_bench import summarise as nodes_summarise

    timings = {"one_node": [(2.0, 40), (4.0, 40), (5.0, 40)], "two_nodes": [(2.4, 40), (4.0, 40), (5.5, 40)]}
    hosts = {"one_node": ["vm", "vm"], "two_nodes": ["vm", "vm"]}
    result = nodes_summarise(NodesCase("tiny", 3, 1), timings, True, hosts, 1000)
    assert result["ratio"]["median"] == pytest.approx(1.1)  # of 1.2, 1.0, 1.1
    assert result["ratio"]["min"] == pytest.approx(1.0) and result["ratio"]["max"] == pytest.approx(1.2)
    assert result["same_tokens"] and result["same_weights"] and result["trained_tokens"] == 40
    flat = flatten({"nodes": {"cases": [result]}})
    assert flat["nodes_update_ratio"] == pytest.approx(1.1) and flat["nodes_update_ratio.tiny.same_weights"] is True
    assert "nodes_update_ratio" not in flatten({})
    from benchmarks.suite import _stamp

    table = nodes_section({**_stamp("cpu"), "threads": 1, "cases": [{**result, "same_weights": False}]})
    assert table[-2].endswith("| 40 | NO |")  # a difference in the weights is shown, never hidden
