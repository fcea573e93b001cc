"""RESULTS.md: the report of a ``python -m benchmarks`` run, from the sections' results."""

from __future__ import annotations

from typing import Any

from benchmarks.markdown_engines import (
    async_section,
    async_summary,
    gpu_section,
    group_section,
    group_summary,
    lora_section,
    machine_line,
    nodes_section,
    rollout_section,
    servers_section,
    store_section,
    update_section,
    vllm_section,
    vllm_summary,
)
from benchmarks.report import flatten, fmt_spread, per_minute_verdict, verdict
from benchmarks.suite import TARGETS

LAKE_BEGIN, LAKE_END = "<!-- lake_bench:begin -->", "<!-- lake_bench:end -->"


def summary(details: dict[str, Any]) -> list[str]:
    flat = flatten(details)
    peer = details.get("peer")
    lines = [
        "| measure | median [min-max] (n) | target | verdict |",
        "|---|---|---|---|",
    ]
    rollout, update = details.get("rollout", {}).get("cases", []), details.get("update", {}).get("cases", [])
    if rollout:
        worst = min(rollout, key=lambda c: c["ratio"]["median"])
        lines.append(
            f"| rollout efficiency, worst case ({worst['shape']} {worst['case']}) | {fmt_spread(worst['ratio'])} "
            f"| >= {TARGETS['rollout_efficiency']} | {verdict('rollout_efficiency', flat['rollout_efficiency'])} |"
        )
    if update:
        worst = min(update, key=lambda c: c["ratio"]["median"])
        lines.append(
            f"| update efficiency, worst case ({worst['shape']}) | {fmt_spread(worst['ratio'])} "
            f"| >= {TARGETS['update_efficiency']} | {verdict('update_efficiency', flat['update_efficiency'])} |"
        )
    flow = details.get("flow")
    if flow:
        demo = flow["demo"]["overhead_share"]
        lines.append(
            f"| orchestration overhead, demo config | {fmt_spread(demo, 1, True)} | <= 5% "
            f"| {verdict('orchestration_overhead', demo['median'])} |"
        )
        lines.append(
            f"| orchestration overhead, 10x batch | {fmt_spread(flow['large']['overhead_share'], 1, True)} | - | - |"
        )
        lines.append(
            f"| Parquet write share of an iteration | {fmt_spread(flow['demo']['parquet_write_share'], 2, True)} "
            "| - | - |"
        )
        if "validation_share" in flow["demo"]:
            share = flow["demo"]["validation_share"]
            lines.append(
                f"| data contracts (validate stage) share of an iteration, demo config | {fmt_spread(share, 1, True)} "
                f"| <= 10% | {verdict('validation_share', share['median'])} |"
            )
        growth = flow["memory"]["peak_rss_growth"]
        lines.append(
            f"| peak RSS growth, iteration {flow['memory']['from_iteration']} -> {flow['memory']['to_iteration']} "
            f"| {growth:.3f} | <= {TARGETS['peak_rss_growth']} | {verdict('peak_rss_growth', growth)} |"
        )
    if peer:
        equal = peer["equal_work"]
        lines.append(
            f"| iteration time, ours / TRL (equal work) | {equal['trl_iteration_time_ratio']:.2f} (per-iteration "
            f"pairs {fmt_spread(equal['ours_over_trl_per_iteration'])}) "
            f"| <= {TARGETS['trl_iteration_time_ratio']} "
            f"| {verdict('trl_iteration_time_ratio', equal['trl_iteration_time_ratio'])} |"
        )
        for name, label in (("equal_work", "equal work"), ("starpo_s", "ours StarPO-S vs TRL GRPO")):
            pairing = peer[name]
            ours, trl = pairing["ours"]["success_gain_per_minute"], pairing["trl"]["success_gain_per_minute"]
            lines.append(
                f"| validation success gained per training minute, {label} | ours {ours:.3f} vs TRL {trl:.3f} "
                f"| ours >= TRL | {per_minute_verdict(pairing)} |"
            )
    lines += vllm_summary(details.get("vllm"), flat)
    lines += group_summary(details, flat)
    lines += async_summary(details.get("async"), flat)
    view = details.get("view")
    if view:
        lines.append(
            f"| `ragen view`: slowest browsing page, {view['lake']['trajectories']:,} trajectories (median s) "
            f"| {flat['view_page_s']:.3f} | <= {TARGETS['view_page_s']} "
            f"| {verdict('view_page_s', flat['view_page_s'])} |"
        )
    return lines


def _flow_row(name: str, summary: dict[str, Any]) -> str:
    return (
        f"| {name} | {summary['overhead_share']['n']} | {fmt_spread(summary['iteration_wall_s'])} "
        f"| {fmt_spread(summary['core_s'])} | {fmt_spread(summary['overhead_share'], 1, True)} "
        f"| {summary['subflow_and_glue_s']['median']:.2f} | {summary['task_wrappers_s']['median']:.2f} |"
    )


def flow_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 3. Orchestration overhead", ""]
    if not section:
        return lines + ["Not run.", ""]
    demo, large, variant = section["demo"], section["large"], section["variant"]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        "A real `train` flow run (Prefect's temporary server, a task per stage; each iteration a group of tasks of "
        "`train`, since the measurement below showed a subflow per iteration costing too much). "
        "Overhead = (iteration wall time - time inside the stages' core calls) / wall time, over the iterations "
        "without validation. `subflow + glue` = wall time outside every stage's task call; `task wrappers` = time "
        "inside task calls but outside their core call.",
        "",
        "| config | iterations | wall s | core s | overhead | subflow + glue s | task wrappers s |",
        "|---|---|---|---|---|---|---|",
        _flow_row("demo (configs/bandit.yaml, 8 x 16)", demo),
        _flow_row("10x batch (80 x 16)", large),
        _flow_row("demo, previous design: `starpo_iteration` subflow, records unquoted", variant),
        "",
        "Per stage at the demo config (median seconds over the iterations): task call vs its core call.",
        "",
        "| stage | task call s | core call s |",
        "|---|---|---|",
    ]
    core_names = {
        "generate": "generate_rollouts",
        "persist": "persist",
        "validate": "validate",
        "filter": "filter_and_publish",
        "update": "update_policy",
        "commit": "commit_iteration",
    }
    plain = [r for r in demo["rows"] if not r["evaluated"]]
    for stage, core in core_names.items():
        task_s = sorted(r["stage_s"].get(stage, 0.0) for r in plain)[len(plain) // 2]
        core_s = sorted(r["core"].get(core, 0.0) for r in plain)[len(plain) // 2]
        lines.append(f"| {stage} | {task_s:.3f} | {core_s:.3f} |")
    growth = large["overhead_share"]["median"] / demo["overhead_share"]["median"]
    largest = max(demo["core_by_stage_s"], key=lambda name: demo["core_by_stage_s"][name]["median"])
    absolute = [s["subflow_and_glue_s"]["median"] + s["task_wrappers_s"]["median"] for s in (large, demo)]
    lines += [
        "",
        f"What the demo's overhead is: {demo['subflow_and_glue_s']['median']:.2f} s per iteration outside every "
        f"stage's task call and {demo['task_wrappers_s']['median']:.2f} s inside task calls but outside their core "
        f"call, i.e. Prefect's task-run bookkeeping (about {1000 * demo['task_wrappers_s']['median'] / 7:.0f} ms "
        "for each of the 7 task runs of an iteration without validation); the core calls themselves are in the "
        f"table above (the largest: `{largest}`). The iteration's metrics artifact is published in the background "
        "(a task run on the flow's thread pool, overlapping the next iteration's compute): what it costs the "
        "iteration is its submission and the wait for the previous one, both inside the measured wall time.",
        "",
        f"Growth: at 10x the batch the overhead share is {large['overhead_share']['median']:.1%} "
        f"({growth:.2f}x the demo's share; {absolute[0]:.2f} s vs {absolute[1]:.2f} s of overhead per iteration).",
        "",
    ]
    return lines


def _pairing(section: dict[str, Any], title: str, note: str) -> list[str]:
    lines = [
        f"### {title}",
        "",
        note,
        "",
        "| | s per iteration | validation success (start -> end) | training minutes | success gained / minute |",
        "|---|---|---|---|---|",
    ]
    for side, name in (("ours", "ours (train flow)"), ("trl", "TRL GRPOTrainer")):
        curve = section[side]["curve"]
        lines.append(
            f"| {name} | {fmt_spread(section[f'{side}_iteration_s'])} | {curve[0]['success']:.3f} -> "
            f"{curve[-1]['success']:.3f} | {section[side]['train_minutes']:.2f} "
            f"| {section[side]['success_gain_per_minute']:.3f} |"
        )
    lines += [
        "",
        f"Ours / TRL per iteration: {section['trl_iteration_time_ratio']:.2f} (pairs "
        f"{fmt_spread(section['ours_over_trl_per_iteration'])}). Success per minute: {per_minute_verdict(section)}.",
        "",
        "| updates | ours success | ours minutes | TRL success | TRL minutes |",
        "|---|---|---|---|---|",
    ]
    for ours, trl in zip(section["ours"]["curve"], section["trl"]["curve"], strict=False):
        lines.append(
            f"| {ours['updates']} | {ours['success']:.3f} | {ours['train_minutes']:.2f} | {trl['success']:.3f} "
            f"| {trl['train_minutes']:.2f} |"
        )
    return lines + [""]


def peer_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 5. TRL's GRPOTrainer side by side", ""]
    if not section:
        return lines + ["Not run.", ""]
    equal = section["equal_work"]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        f"TRL {section['machine']['versions'].get('trl')} and our `train` flow start from the same bootstrapped tiny "
        f"model, with the same Bandit prompts (identical token ids: {equal['prompt_ids_identical']}), the same reward "
        "(our env + format penalty), 8 prompts x 16 generations per iteration, optimizer steps on mini-batches of 16, "
        "HF `generate`, 32 new tokens, fp32, lr 1e-3 constant, clip 0.2/0.28, no KL, token-mean loss. Interleaved "
        "per iteration (one of ours, then one TRL generation cycle, never at once). Both are validated by the same "
        "evaluator (our validation rollouts: same instances and sampling seeds) after the same number of updates; "
        f"validation time is excluded from both sides' times. {equal['iterations']} iterations per pairing.",
        "",
    ]
    lines += _pairing(
        equal,
        "Equal work: our variance filter off",
        f"Both train on all 128 rollouts ({equal['optimizer_steps_per_iteration']} optimizer steps per iteration).",
    )
    stages = equal.get("ours_stage_s")
    if stages:  # the per-stage breakdown of both sides, met or not
        trl_s = equal["trl_iteration_s"]["median"]
        lines += [
            f"Where our equal-work iteration goes (median s per stage; TRL's whole iteration: {trl_s:.2f} s): "
            + ", ".join(f"{name} {value:.2f}" for name, value in sorted(stages.items(), key=lambda kv: -kv[1]))
            + ". TRL has no counterpart of our validate (data contracts) and persist stages.",
            "",
        ]
    lines += _pairing(
        section["starpo_s"],
        "Recommended configs: ours StarPO-S (demo config) vs TRL GRPO",
        "Ours keeps the 25% highest-variance groups (2 optimizer steps on 32 rollouts); TRL trains on all 128.",
    )
    return lines


def memory_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 6. Memory", ""]
    if not section:
        return lines + ["Not run.", ""]
    memory = section["memory"]
    peaks = memory["peak_rss_mib"]
    marks = sorted({1, memory["from_iteration"], *range(10, len(peaks) + 1, 5), len(peaks)})
    lines += [
        "Peak resident memory of the benchmark process per iteration of the demo run (sampled every 10 ms).",
        "",
        "| iteration | " + " | ".join(str(i) for i in marks) + " |",
        "|---" * (len(marks) + 1) + "|",
        "| peak RSS MiB | " + " | ".join(f"{peaks[i - 1]:.0f}" for i in marks) + " |",
        "",
        f"`peak_rss_growth` = (peak at iteration {memory['to_iteration']} - peak at iteration "
        f"{memory['from_iteration']}) / peak at iteration {memory['from_iteration']} = "
        f"{memory['peak_rss_growth']:.4f} (target <= {TARGETS['peak_rss_growth']}: "
        f"{verdict('peak_rss_growth', memory['peak_rss_growth'])}).",
        "",
    ]
    return lines


def storage_section(lake: dict[str, Any] | None, flow: dict[str, Any] | None) -> list[str]:
    lines = ["## 4. Storage", ""]
    if flow:
        share = flow["demo"]["parquet_write_share"]
        lines += [
            "Parquet writes (encode + fsync + atomic rename, `atomic_write_parquet`) take "
            f"{fmt_spread(share, 2, True)} of an iteration's wall time at the demo config "
            f"({flow['demo']['parquet_write_s']['median'] * 1000:.0f} ms per iteration).",
            "",
        ]
    if not lake:
        return lines + ["DuckDB queries: not run.", ""]
    sizes = list(lake["sizes"])
    queries = list(lake["sizes"][sizes[0]]["queries_before_compaction"])
    lines += [
        f"Machine: {machine_line(lake)}.",
        "",
        "DuckDB time of the documented queries (docs/sql.md, each run cold as `ragen sql` runs it: a fresh "
        "connection, file listing and views), median seconds, by lake size in turns (2 runs x "
        f"{lake['sizes'][sizes[0]]['shape']['iterations']} iterations, 5 turns per trajectory):",
        "",
        "| query | " + " | ".join(f"{int(s):,} turns" for s in sizes) + " |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    for name in queries:
        cells = [f"{lake['sizes'][s]['queries_before_compaction'][name]['median_s']:.3f}" for s in sizes]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    totals = [sum(t["median_s"] for t in lake["sizes"][s]["queries_before_compaction"].values()) for s in sizes]
    lines.append("| **all queries** | " + " | ".join(f"**{t:.3f}**" for t in totals) + " |")
    if len(sizes) > 1:
        first, last = int(sizes[0]), int(sizes[-1])
        lines += [
            "",
            f"From {first:,} to {last:,} turns ({last // first}x the rows) the whole query set takes "
            f"{totals[-1] / totals[0]:.1f}x as long.",
        ]
    from benchmarks.lake_bench import markdown as lake_markdown

    largest = lake["sizes"][sizes[-1]]
    if largest.get("compaction"):
        section = lake_markdown(largest).rstrip("\n").replace("## Trajectory lake", "### Trajectory lake")
        lines += ["", LAKE_BEGIN, section, LAKE_END]
    return lines + [""]


def view_section(view: dict[str, Any] | None) -> list[str]:
    """The rollout viewer's page times (benchmarks/view_bench.py)."""
    from benchmarks.view_bench import markdown

    if not view:
        return ["## Rollout viewer", "", "Not run.", ""]
    heading, *rest = markdown(view).splitlines()
    return [heading, "", f"Machine: {machine_line(view)}.", *rest, ""]


def host_section(host: dict[str, Any] | None) -> list[str]:
    """The host's share of an iteration, before and after the one token path (benchmarks/host_bench.py)."""
    from benchmarks.host_bench import markdown

    if not host:
        return ["## Host share of an iteration", "", "Not run.", ""]
    heading, *rest = markdown(host).splitlines()
    return [heading, "", f"Machine: {machine_line(host)}.", *rest, ""]


def render(details: dict[str, Any]) -> str:
    """The whole RESULTS.md."""
    flow = details.get("flow")
    lines = [
        "# Benchmark results",
        "",
        f"Regenerated by `make bench` (`python -m benchmarks{' --quick' if details.get('quick') else ''}`) at "
        f"{details.get('generated_at')} in {details.get('total_seconds', 0) / 60:.1f} minutes. Absolute times on a "
        "shared machine are noise, so every figure is a ratio whose numerator and denominator were measured in the "
        "same process, interleaved (A B, B A, ...); tables give the median, [min-max] and the number of repeats. "
        "Machine-readable: `benchmarks/results.json` (flat) and `benchmarks/results/details.json`.",
        "",
        "## Summary",
        "",
        *summary(details),
        "",
        *rollout_section(details.get("rollout"), "1. Rollout efficiency"),
        *update_section(details.get("update"), "2. Update efficiency"),
        *group_section(details.get("group")),
        *nodes_section(details.get("nodes")),
        *servers_section(details.get("servers")),
        *store_section(details.get("store")),
        *async_section(details.get("async")),
        *lora_section(details.get("lora")),
        *host_section(details.get("host")),
        *flow_section(flow),
        *storage_section(details.get("lake"), flow),
        *view_section(details.get("view")),
        *peer_section(details.get("peer")),
        *memory_section(flow),
        *gpu_section(details.get("gpu")),
        *vllm_section(details.get("vllm")),
    ]
    errors = details.get("errors", {})
    if errors:
        lines += ["## Sections that failed", ""] + [f"- {name}: `{message}`" for name, message in errors.items()]
    return "\n".join(lines).rstrip("\n") + "\n"
