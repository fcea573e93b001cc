"""From the sections' results to ``results.json`` (a flat object) and ``RESULTS.md`` (the report)."""

from __future__ import annotations

from typing import Any

from benchmarks.suite import TARGETS

REQUIRED_KEYS = tuple(TARGETS)  # the headline keys of results.json (None where their section did not run)


def _cases(details: dict[str, Any], section: str) -> list[dict[str, Any]]:
    return details.get(section, {}).get("cases", [])


def flatten(details: dict[str, Any]) -> dict[str, Any]:
    """The flat ``results.json``: the headline keys (None where the section did not run) and per-case figures."""
    flat: dict[str, Any] = dict.fromkeys(REQUIRED_KEYS)
    flat.update({f"target.{key}": value for key, value in TARGETS.items()})
    for key in ("generated_at", "quick", "device", "threads", "total_seconds"):
        flat[key] = details.get(key)
    machine = next((details[s]["machine"] for s in ("flow", "rollout", "update", "lake") if s in details), {})
    for key in ("cpu", "cpus", "memory_gib", "load_average_at_start", "gpu", "python"):
        flat[f"machine.{key}"] = machine.get(key)
    rollout = [c for c in _cases(details, "rollout")]
    for case in rollout:
        prefix = f"rollout_efficiency.{case['shape']}.{case['case']}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.min"], flat[f"{prefix}.max"] = case["ratio"]["min"], case["ratio"]["max"]
        flat[f"{prefix}.ours_tokens_per_s"] = case["ours_tokens_per_s"]["median"]
        flat[f"{prefix}.bare_tokens_per_s"] = case["bare_tokens_per_s"]["median"]
    if rollout:
        flat["rollout_efficiency"] = min(c["ratio"]["median"] for c in rollout)
    update = _cases(details, "update")
    for case in update:
        prefix = f"update_efficiency.{case['shape']}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.min"], flat[f"{prefix}.max"] = case["ratio"]["min"], case["ratio"]["max"]
        flat[f"{prefix}.ours_tokens_per_s"] = case["ours_tokens_per_s"]["median"]
        flat[f"{prefix}.bare_tokens_per_s"] = case["bare_tokens_per_s"]["median"]
    if update:
        flat["update_efficiency"] = min(c["ratio"]["median"] for c in update)
    _flatten_peak_and_group(details, flat)
    _flatten_flow(details.get("flow"), flat)
    _flatten_peer(details.get("peer"), flat)
    _flatten_lake(details.get("lake"), flat)
    _flatten_gpu(details.get("gpu"), flat)
    _flatten_vllm(details.get("vllm"), flat)
    _flatten_servers(details.get("servers"), flat)
    _flatten_store(details.get("store"), flat)
    _flatten_async(details.get("async"), flat)
    _flatten_view(details.get("view"), flat)
    _flatten_host(details.get("host"), flat)
    _flatten_lora(details.get("lora"), flat)
    return flat


def _flatten_lora(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    """Per shape and side: trainable parameters, optimizer-state bytes, update tokens/s, peak RSS, and the LoRA
    sides' ratios to full fine-tuning."""
    for case in (section or {}).get("cases", []):
        for side, numbers in case["sides"].items():
            prefix = f"lora.{case['shape']}.{side}"
            flat[f"{prefix}.trainable_parameters"] = numbers["trainable_parameters"]
            flat[f"{prefix}.optimizer_state_bytes"] = numbers["optimizer_state_bytes"]
            flat[f"{prefix}.update_tokens_per_s"] = numbers["update_tokens_per_s"]["median"]
            flat[f"{prefix}.peak_rss_mib"] = numbers["peak_rss_mib"]["median"]
            flat[f"{prefix}.sampling_s"] = numbers["sampling_seconds"]["median"]
            if "handoff_seconds" in numbers:  # benches before the hand-off was measured lack it
                flat[f"{prefix}.handoff_s"] = numbers["handoff_seconds"]["median"]
                flat[f"{prefix}.handoff_bytes"] = numbers["handoff_bytes"]
                flat[f"{prefix}.handoff_share"] = numbers["handoff_share"]
            if side != "full":
                for ratio in ("update_speed_vs_full", "peak_rss_vs_full", "optimizer_state_vs_full"):
                    flat[f"{prefix}.{ratio}"] = numbers[ratio]


def _flatten_host(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    """Per shape: the host's seconds and share of an iteration before and after the one token path, and after /
    before of the seconds (``host_ratio``, with its range)."""
    if not section:
        return
    flat["host.before_commit"] = section["before"]
    for shape in section["shapes"]:
        row = section[shape]
        for side in ("before", "after"):
            flat[f"host_share.{shape}.{side}"] = row[f"{side}.host_share"]
            flat[f"host_s.{shape}.{side}"] = row[f"{side}.host_s"]
        ratio = row["host_ratio"]
        flat[f"host_ratio.{shape}"] = ratio["median"]
        flat[f"host_ratio.{shape}.min"], flat[f"host_ratio.{shape}.max"] = ratio["min"], ratio["max"]


def _flatten_view(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    """``view_page_s`` (the slowest browsing page's median, in seconds) and every page's median, keyed by the lake's
    size in trajectories."""
    if not section:
        return
    size = section["lake"]["trajectories"]
    flat["view_page_s"] = section["page_max_median_s"]
    flat["view_lake_trajectories"] = size
    for name, timing in section["pages"].items():
        flat[f"view_page_s.{name}"] = timing["median_s"]


def _flatten_async(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    """``async_iteration_ratio`` (the first case's async / sync time per step: the target's case) and each case's,
    keyed by its shape, env, turns, tokens and the async side's log-prob reuse, with its idle shares."""
    if not section or not section.get("cases"):
        return
    for case in section["cases"]:
        spec = case["case"]
        shape = f"{spec['shape']}.{spec['env']}.{spec['max_turns']}x{spec['max_new_tokens']}"
        prefix = f"async_iteration_ratio.{shape}.reuse_{spec.get('async_reuse', 'auto')}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.min"], flat[f"{prefix}.max"] = case["ratio"]["min"], case["ratio"]["max"]
        if "parallel_capacity" in case:
            flat[f"{prefix}.parallel_capacity"] = case["parallel_capacity"]["median"]
        for side in ("sync", "async"):
            for share in ("learner_idle_share", "sampler_idle_share"):
                flat[f"{prefix}.{side}.{share}"] = case[side][share]["median"]
    flat["async_iteration_ratio"] = section["cases"][0]["ratio"]["median"]


def _flatten_peak_and_group(details: dict[str, Any], flat: dict[str, Any]) -> None:
    """``update_peak_share`` (the largest model's update over the measured matmul peak) and
    ``launched_group_update_ratio`` (the largest model's group / in-process update time) and ``nodes_update_ratio``
    (the largest model's two-node / one-node update time), per shape too."""
    flat.setdefault("update_peak_share", None)
    shared = [c for c in _cases(details, "update") if "peak_share" in c]
    for case in shared:
        flat[f"update_peak_share.{case['shape']}"] = case["peak_share"]["share"]
        flat[f"update_achieved_tflops.{case['shape']}"] = case["peak_share"]["achieved_tflops"]
    if shared:
        largest = max(shared, key=lambda c: c["parameters"])
        flat["update_peak_share"] = largest["peak_share"]["share"]
        flat["matmul_peak_tflops"] = largest["peak_share"]["peak_tflops"]
    group = _cases(details, "group")
    for case in group:
        prefix = f"launched_group_update_ratio.{case['shape']}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.min"], flat[f"{prefix}.max"] = case["ratio"]["min"], case["ratio"]["max"]
        flat[f"{prefix}.export_handoff"] = case["export_ratio"]["median"]
    if group:
        flat["launched_group_update_ratio"] = max(group, key=lambda c: c["parameters"])["ratio"]["median"]
    nodes = _cases(details, "nodes")
    for case in nodes:
        prefix = f"nodes_update_ratio.{case['shape']}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.min"], flat[f"{prefix}.max"] = case["ratio"]["min"], case["ratio"]["max"]
        flat[f"{prefix}.same_weights"] = case["same_weights"]
    if nodes:
        flat["nodes_update_ratio"] = max(nodes, key=lambda c: c["parameters"])["ratio"]["median"]


def _flatten_vllm(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    if not section:
        return
    for case in section["cases"]:
        prefix = f"vllm.{case['shape']}.{case['case']}"
        flat[f"{prefix}.vllm_over_hf"] = case["vllm_over_hf"]["median"]
        flat[f"{prefix}.vllm_over_bare"] = case["vllm_over_bare"]["median"]
        for side in ("vllm", "hf", "bare"):
            flat[f"{prefix}.{side}_tokens_per_s"] = case[f"{side}_tokens_per_s"]["median"]
        if case["shape"] == "20m" and case["case"] == "sokoban":
            flat["vllm_speedup_multiturn"] = case["vllm_over_hf"]["median"]
    for shape, seconds in section["engine_start_s"].items():
        flat[f"vllm.engine_start_s.{shape}"] = seconds
    push = section["push"]
    if push["push_share"]:
        flat["weight_push_share"] = push["push_share"]["median"]
        flat["vllm.weight_push_s"] = push["push_seconds"]["median"]
        flat["vllm.iteration_wall_s"] = push["iteration_wall_s"]["median"]


def _flatten_servers(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    """Per case: two servers' groups per second over one server's (``servers_rollout_ratio``: the largest model's
    multi-turn case) and whether both sampled the same rollouts; per side: a push's seconds and share."""
    if not section:
        return
    for case in section["cases"]:
        prefix = f"servers_rollout_ratio.{case['shape']}.{case['case']}"
        flat[prefix] = case["two_over_one"]["median"]
        flat[f"{prefix}.min"], flat[f"{prefix}.max"] = case["two_over_one"]["min"], case["two_over_one"]["max"]
        flat[f"{prefix}.same_rollouts"] = case["same_rollouts"]
    if section["cases"]:
        largest = max(section["cases"], key=lambda c: (section["parameters"][c["shape"]], c["turns"]))
        flat["servers_rollout_ratio"] = largest["two_over_one"]["median"]
    for side, push in section["push"].items():
        if push["push_share"]:
            flat[f"servers_push_share.{side}"] = push["push_share"]["median"]
            flat[f"servers_push_s.{side}"] = push["push_seconds"]["median"]


def _flatten_store(section: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    """The demo's seconds per iteration on a bucket over a local folder (``store_iteration_ratio``) and `ragen sql`'s
    seconds on each (a local copy empty and up to date)."""
    if not section:
        return
    ratio = section["store_over_local"]
    flat["store_iteration_ratio"] = ratio["median"]
    flat["store_iteration_ratio.min"], flat["store_iteration_ratio.max"] = ratio["min"], ratio["max"]
    for side, seconds in section["sql_seconds"].items():
        flat[f"store_sql_s.{side}"] = seconds["median"]
    flat["store_sql_warm_over_local"] = section["sql_warm_over_local"]["median"]
    flat["store_run_ratio"] = section["run_over_local"]["median"]


def _flatten_flow(flow: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    if not flow:
        return
    flat["orchestration_overhead"] = flow["demo"]["overhead_share"]["median"]
    for label in ("demo", "large", "variant"):
        summary = flow[label]
        name = {"demo": "demo", "large": "10x", "variant": "subflow_per_iteration"}[label]
        flat[f"orchestration_overhead.{name}"] = summary["overhead_share"]["median"]
        flat[f"orchestration_overhead.{name}.min"] = summary["overhead_share"]["min"]
        flat[f"orchestration_overhead.{name}.max"] = summary["overhead_share"]["max"]
        flat[f"iteration_wall_s.{name}"] = summary["iteration_wall_s"]["median"]
    flat["parquet_write_share"] = flow["demo"]["parquet_write_share"]["median"]
    if "validation_share" in flow["demo"]:  # details written before the key existed lack it
        flat["validation_share"] = flow["demo"]["validation_share"]["median"]
    memory = flow["memory"]
    flat["peak_rss_growth"] = memory["peak_rss_growth"]
    flat[f"peak_rss_mib.iteration_{memory['from_iteration']}"] = memory["peak_rss_mib"][memory["from_iteration"] - 1]
    flat[f"peak_rss_mib.iteration_{memory['to_iteration']}"] = memory["peak_rss_mib"][-1]


def _flatten_peer(peer: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    if not peer:
        return
    equal = peer["equal_work"]
    flat["trl_iteration_time_ratio"] = equal["trl_iteration_time_ratio"]
    flat["trl_iteration_time_ratio.min"] = equal["ours_over_trl_per_iteration"]["min"]
    flat["trl_iteration_time_ratio.max"] = equal["ours_over_trl_per_iteration"]["max"]
    flat["ours_iteration_s"] = equal["ours_iteration_s"]["median"]
    flat["trl_iteration_s"] = equal["trl_iteration_s"]["median"]
    for pairing in ("equal_work", "starpo_s"):
        result = peer[pairing]
        flat[f"trl_iteration_time_ratio.{pairing}"] = result["trl_iteration_time_ratio"]
        for side in ("ours", "trl"):
            flat[f"validation_success_gain_per_minute.{pairing}.{side}"] = result[side]["success_gain_per_minute"]
            flat[f"validation_success_final.{pairing}.{side}"] = result[side]["final_success"]


def per_minute_verdict(pairing: dict[str, Any]) -> str:
    """Ours no worse than TRL in validation success gained per training minute (when either side gained any)."""
    ours, trl = pairing["ours"], pairing["trl"]
    gains = ours["success_gain_per_minute"], trl["success_gain_per_minute"]
    if max(gains) <= 0:
        start = ours["curve"][0]["success"]
        return (
            f"not comparable: neither improved (from {start:.3f}: ours -> {ours['final_success']:.3f}, "
            f"TRL -> {trl['final_success']:.3f})"
        )
    return "met" if gains[0] >= gains[1] else f"missed ({gains[0]:.3f} vs {gains[1]:.3f} per minute)"


def _flatten_lake(lake: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    if not lake:
        return
    for turns, result in lake["sizes"].items():
        timings = result["queries_before_compaction"]
        flat[f"duckdb_queries_total_s.{turns}_turns"] = sum(t["median_s"] for t in timings.values())
        flat[f"duckdb_query_max_s.{turns}_turns"] = max(t["median_s"] for t in timings.values())


def _flatten_gpu(gpu: dict[str, Any] | None, flat: dict[str, Any]) -> None:
    if not gpu:
        flat["gpu.run"] = False
        return
    flat["gpu.run"] = True
    flat["gpu.name"] = next(iter(gpu.values()))["machine"].get("gpu")
    for case in gpu.get("rollout", {}).get("cases", []):
        prefix = f"gpu.rollout_efficiency.{case['shape']}.{case['case']}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.ours_tokens_per_s"] = case["ours_tokens_per_s"]["median"]
    for case in gpu.get("update", {}).get("cases", []):
        prefix = f"gpu.update_efficiency.{case['shape']}"
        flat[prefix] = case["ratio"]["median"]
        flat[f"{prefix}.ours_tokens_per_s"] = case["ours_tokens_per_s"]["median"]
        flat[f"gpu.update_mfu.{case['shape']}"] = case["mfu"]["mfu"]


def fmt_spread(values: dict[str, float], digits: int = 2, percent: bool = False) -> str:
    """'median [min-max] (n=N)'."""
    scale, unit = (100.0, "%") if percent else (1.0, "")
    return (
        f"{values['median'] * scale:.{digits}f}{unit} [{values['min'] * scale:.{digits}f}-"
        f"{values['max'] * scale:.{digits}f}] (n={values['n']})"
    )


def verdict(key: str, value: float | None) -> str:
    """'met' or 'missed by ...' against the target of ``key``."""
    if value is None:
        return "not run"
    target = TARGETS[key]
    if key in ("rollout_efficiency", "update_efficiency", "vllm_speedup_multiturn"):
        return "met" if value >= target else f"missed by {target - value:.2f} ({(target - value) / target:.0%} short)"
    if key == "trl_iteration_time_ratio":
        return "met" if value <= target else f"missed: ours {value:.2f}x TRL's time per iteration"
    if key in ("orchestration_overhead", "validation_share", "weight_push_share"):
        return "met" if value <= target else f"missed by {(value - target) * 100:.1f} points"
    return "met" if value <= target else f"missed by {value - target:.3f}"
