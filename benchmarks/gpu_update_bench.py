"""A bf16 StarPO run of a ~0.5B-parameter Qwen2-architecture model with random weights (nothing is downloaded) on
GPUs: ``--iterations`` (default 3) iterations through the normal ``train`` flow; update throughput and model FLOPs
utilisation (MFU) read from the run's own metrics.

    python -m benchmarks.gpu_update_bench [--shape 0.5b] [--case bandit|sokoban] [--iterations 3]
                                          [--launcher inprocess|torchrun|deepspeed] [--nproc N] [--zero-stage S]
                                          [--micro-batch-tokens N] [--gradient-checkpointing] [--peak-tflops T]
                                          [--rollouts synthetic|hf] [--profile DIR] [--no-report]

The batch (``--rollouts synthetic``, the default) is not sampled: replies of ``max_new_tokens`` tokens each (the
length a random-weight model's replies run to), random token ids around a valid answer of one random action, drawn
from the run's seeds (:mod:`benchmarks.synthetic_batch`); the envs, their prompts and rewards, the filter and the
update are the run's own. So the in-process and the launched bench train on the identical batch, and neither spends
its time sampling (the Hugging Face rollouts of the 0.47B model were most of a bench's ~140 s on an H100).
``--rollouts hf`` samples the batch with the Hugging Face backend instead, as before.

Cases: ``bandit`` (the paper's batch of 8 groups x 16 rollouts, one turn of 128 new tokens: ~280 tokens per trajectory,
StarPO-S keeps 32 rows, ~9k tokens) and ``sokoban`` (RAGEN's multi-turn Sokoban: 5 turns of 200 new tokens, 1-2k
tokens per trajectory), see :func:`case_overrides`.

Writes the "GPU update" section of ``benchmarks/RESULTS.md`` (naming the GPU) and ``benchmarks/results/gpu.json``.
``--shape tiny --no-report`` runs the same path on a CPU in about a minute (fp32; MFU needs ``--peak-tflops``).

``--profile DIR`` (in-process only) also traces the second update with ``torch.profiler`` and writes where its time
went (kernels by kind, the GPU's busy share, the costliest kernels: :mod:`benchmarks.update_profile`) into
``DIR/profile.json`` and ``DIR/profile.md``; that update's own time then carries the profiler's overhead.

FLOPs per update (:func:`benchmarks.peak.update_flops`): the actor trains on the batch ``ppo_epochs`` times
(forward + backward, 6 N per token) and, unless the iteration took the sampler's log-probs as the old ones (fp32
Hugging Face rollouts: the run then records ``actor/behavior_logprob_gap``; never in bf16), re-scores it once first
(2 N per token), N the parameter count and the tokens every position of the kept trajectories (prompts included);
attention's own FLOPs (small at these lengths) are left out, so the MFU is slightly understated. Peak:
``--peak-tflops``, or the dense bf16 figure of a known GPU per process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import HERE, machine, quiet_libraries, replace_marked_section

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, TFLOP/s per GPU.
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10G": 125.0,
    "L4": 121.0,
}
BEGIN, END = "<!-- gpu_update_bench:begin -->", "<!-- gpu_update_bench:end -->"
ROLLOUTS = {
    "synthetic": "synthetic replies drawn from the run's seeds, no sampling",
    "hf": "sampled with the Hugging Face rollout backend",
}


def peak_tflops(gpu: str | None, given: float | None) -> float | None:
    """The per-GPU peak: ``given``, else the table entry whose name occurs in the GPU's name (longest first)."""
    if given:
        return given
    for name in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if gpu and name in gpu:
            return PEAK_BF16_TFLOPS[name]
    return None


CASES = {
    "bandit": ["env.name=bandit", "env.val_envs=[bandit]", "rollout.max_new_tokens=128"],
    # RAGEN's Sokoban: 5 turns, up to 5 actions per turn and 10 per trajectory; replies of up to 200 tokens make a
    # trajectory of 1-2k tokens (prompt, observations and replies)
    "sokoban": [
        "env.name=sokoban",
        "env.val_envs=[sokoban]",
        "env.max_turns=5",
        "env.max_actions_per_turn=5",
        "env.max_actions_per_traj=10",
        "rollout.max_new_tokens=200",
    ],
}


def case_overrides(args: argparse.Namespace) -> list[str]:
    """The environment of ``--case`` and the update's micro-batching (token budget, gradient checkpointing)."""
    tokens = f"actor.micro_batch_tokens={args.micro_batch_tokens or 'null'}"
    return [*CASES[args.case], tokens, f"actor.gradient_checkpointing={str(args.gradient_checkpointing).lower()}"]


def overrides(args: argparse.Namespace, model_dir: Path) -> list[str]:
    """The run: the paper's batch (8 groups x 16 rollouts, StarPO-S keeps 25%) of ``--case``'s environment."""
    zero = args.zero_stage if args.zero_stage is not None else (2 if args.nproc > 1 else 0)
    return [
        f"model.path={model_dir}",
        "rollout.env_groups=8",
        "rollout.group_size=16",
        "actor.lr=1e-6",
        "actor.mini_batch_size=32",
        f"actor.micro_batch_size={args.micro_batch_size}",
        f"actor.zero_stage={zero}",
        f"trainer.iterations={args.iterations}",
        f"trainer.launcher={args.launcher}",
        f"trainer.nproc={args.nproc}",
        f"trainer.precision={args.precision}",
        "trainer.checkpoint_every=1000",
        "eval.every=1000",
        "eval.instances=16",
        "bootstrap.enabled=false",
        *case_overrides(args),
        *([f"actor.lora.rank={args.lora_rank}", "actor.lora.alpha=32"] if args.lora_rank else []),
    ]


def measure(root: Path, run_id: str, parameters: int, world: int, peak: float | None) -> dict[str, Any]:
    """Per iteration: update seconds, trained and total tokens, tokens/s, achieved TFLOP/s and MFU."""
    import pyarrow.compute as pc

    from benchmarks.peak import update_flops
    from ragen_core.storage import DataLake

    lake = DataLake(root)
    manifest = lake.read_manifest(run_id)
    epochs = manifest.config["actor"]["ppo_epochs"]
    metrics: dict[int, dict[str, float]] = {}
    for row in lake.read_table("metrics", run_id).to_pylist():
        metrics.setdefault(row["iteration"], {})[row["name"]] = row["value"]
    rows = []
    for iteration in sorted(i for i, m in metrics.items() if "time/update" in m):
        table = lake.read_table("trajectories", run_id, iteration)
        kept = table.filter(pc.and_(pc.equal(table["split"], "train"), pc.equal(table["kept"], True)))
        tokens = sum(len(ids) for ids in kept["input_ids"].to_pylist())
        seconds = metrics[iteration]["time/update"]
        rescored = "actor/behavior_logprob_gap" not in metrics[iteration]  # recorded only when it reused them
        flops = update_flops(parameters, tokens, passes=epochs, rescored=rescored)
        achieved = flops / seconds / 1e12
        rows.append(
            {
                "iteration": iteration,
                "update_s": seconds,
                "trained_tokens": metrics[iteration]["actor/trained_tokens"],
                "tokens": tokens,
                "trained_tokens_per_s": metrics[iteration]["actor/trained_tokens"] / seconds,
                "tokens_per_s": tokens / seconds,
                "tflops": achieved,
                "rescored": rescored,
                "mfu": achieved / (peak * world) if peak else None,
            }
        )
    return {"precision": manifest.precision, "iterations": rows, "update_group": manifest.update_group}


def markdown(result: dict[str, Any]) -> str:
    """The "GPU update" section of RESULTS.md."""
    where = result["machine"]
    lines = [
        "## GPU update (`benchmarks/gpu_update_bench.py`)",
        "",
        f"{result['parameters'] / 1e6:,.1f}M-parameter Qwen2-architecture model (random weights), "
        f"{result['run']['precision']}, launcher `{result['launcher']}` x {result['world']} process(es), "
        f"{result['iterations']} iterations of the {result.get('case', 'bandit')} batch "
        f"({ROLLOUTS[result.get('rollouts', 'hf')]}); GPU: **{where['gpu']}** "
        f"(peak {result['peak_tflops']} TFLOP/s bf16 dense per GPU), torch {where['versions']['torch']}, "
        f"DeepSpeed {where['versions']['deepspeed']}.",
        "",
        "| iteration | update s | trained tokens / s | all tokens / s | TFLOP/s | MFU |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["run"]["iterations"]:
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
        lines.append(
            f"| {row['iteration']} | {row['update_s']:.2f} | {row['trained_tokens_per_s']:,.0f} | "
            f"{row['tokens_per_s']:,.0f} | {row['tflops']:.1f} | {mfu} |"
        )
    lines.append("\nIteration 0 includes the engines' first-step set-up; later iterations are the steady state.\n")
    return "\n".join(lines) + "\n"


def update_results(path: Path, section: str) -> None:
    """Replace (or append) this benchmark's section of RESULTS.md."""
    replace_marked_section(path, BEGIN, END, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="0.5b", help="Model shape from benchmarks/models.py (tiny, 20m, 0.5b).")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--launcher", default="inprocess", choices=["inprocess", "torchrun", "deepspeed"])
    parser.add_argument("--nproc", type=int, default=1, help="Processes (GPUs) of the launched update group.")
    parser.add_argument("--zero-stage", type=int, help="Default: 0 in one process, 2 in a group.")
    parser.add_argument("--case", default="bandit", choices=sorted(CASES), help="The batch: see the docstring.")
    parser.add_argument("--micro-batch-size", type=int, default=32, help="Rows per pass at most (the mini-batch).")
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=16384,
        help="Token budget per pass (actor.micro_batch_tokens); 0: passes of --micro-batch-size rows.",
    )
    parser.add_argument("--gradient-checkpointing", action="store_true", help="actor.gradient_checkpointing=true")
    parser.add_argument("--lora-rank", type=int, help="Train LoRA adapters of this rank on every linear layer.")
    parser.add_argument("--precision", default="auto", help="auto (bf16 on a capable GPU), bf16, fp16 or fp32.")
    parser.add_argument("--peak-tflops", type=float, help="Per-GPU peak for the MFU (default: from the GPU's name).")
    parser.add_argument(
        "--rollouts",
        default="synthetic",
        choices=sorted(ROLLOUTS),
        help="synthetic: the batch drawn from the seeds, no sampling; hf: sampled (slow on 0.5B).",
    )
    parser.add_argument("--profile", metavar="DIR", help="Trace the second update (in-process) into DIR/profile.*.")
    parser.add_argument("--root", help="Data root (default: a temporary folder, deleted afterwards).")
    parser.add_argument("--no-report", action="store_true", help="Print only; do not write the results files.")
    args = parser.parse_args()
    if args.profile and (args.launcher != "inprocess" or args.iterations < 2):
        parser.error(
            "--profile traces the second update in this process: use --launcher inprocess and --iterations 2 or more"
        )

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    quiet_libraries(device)
    from benchmarks.models import model_dir, parameter_count
    from benchmarks.synthetic_batch import synthetic_rollouts
    from benchmarks.update_profile import markdown as profile_markdown
    from benchmarks.update_profile import profiled_update
    from flows.train import train
    from ragen_core.policy import load_policy
    from ragen_core.run.checks import load_run_config as load_config

    folder = model_dir(args.shape)
    parameters = parameter_count(load_policy(folder)[0])
    world = args.nproc if args.launcher != "inprocess" else 1
    info = machine(device)
    peak = peak_tflops(info["gpu"], args.peak_tflops)
    config = load_config(None, overrides(args, folder)).to_dict()
    profile: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        root = Path(args.root or scratch)
        if args.rollouts == "synthetic":
            stack.enter_context(synthetic_rollouts())
        if args.profile:
            stack.enter_context(profiled_update(2, profile))
        train(config, data_root=str(root), run_id="gpu-bench")
        run = measure(root, "gpu-bench", parameters, world, peak)
    result = {
        "machine": info,
        "shape": args.shape,
        "case": args.case,
        "rollouts": args.rollouts,
        "parameters": parameters,
        "launcher": args.launcher,
        "world": world,
        "iterations": args.iterations,
        "peak_tflops": peak,
        "run": run,
    }
    section = markdown(result)
    print(section)
    if args.profile:
        out = Path(args.profile)
        out.mkdir(parents=True, exist_ok=True)
        if profile:  # (empty when the run made fewer than two updates)
            profile.update(shape=args.shape, case=args.case, parameters=parameters)
        (out / "profile.json").write_text(json.dumps(profile, indent=2, sort_keys=True) + "\n")
        (out / "profile.md").write_text(profile_markdown(profile))
        print(profile_markdown(profile))
    if not args.no_report:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "gpu.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        update_results(HERE / "RESULTS.md", section)


if __name__ == "__main__":
    main()
