"""``python -m benchmarks``: every benchmark of issue 9 in one run; writes ``benchmarks/results.json`` (flat),
``benchmarks/results/details.json`` (everything measured) and ``benchmarks/RESULTS.md`` (the report).

    python -m benchmarks                    # the full CPU suite (`make bench`), ~15 minutes on 2 cores
    python -m benchmarks --quick            # a smoke run of every section, a few minutes
    python -m benchmarks --only rollout,update --repeats 7
    python -m benchmarks --device cuda      # item 7 on a GPU: rollout and update on a ~0.5B model in bf16

Sections: flow (orchestration overhead, Parquet share, memory), peer (TRL side by side), rollout, update (with its
share of the measured matmul peak), group (the launched update group against the in-process update), nodes (the
group on two nodes against one node of two ranks), lora (LoRA
adapters against full fine-tuning: memory and update speed), async
(asynchronous StarPO against the synchronous iteration, equal work), lake
(DuckDB at 10^4..10^6 turns), view (`ragen view`'s pages on a 10^6-trajectory lake),
vllm (the vLLM backend against the Hugging Face one; needs `make install-vllm`), servers (rollouts on two vLLM servers
against one, and the weight push to both), store (the demo and `ragen sql` with the data root on a local S3 server
against a local folder).
Sections not run keep their previous results in the report (each says when and on which machine it ran). Not a
test: ratios, not absolute times, are the point. The experts' success over 200 seeded instances of every env is a
separate command: ``python -m benchmarks.expert_bench``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.common import HERE, quiet_libraries
from benchmarks.suite import FULL, QUICK, SECTIONS, Sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Small sizes: a smoke run of every section.")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: item 7 only (rollout and update on the ~0.5B model in bf16).",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for every section (default 1: on a shared, loaded machine two "
        "spinning threads per process slow everything several-fold; both sides of every ratio "
        "use the same).",
    )
    parser.add_argument("--only", default="", help=f"Comma-separated sections among {', '.join(SECTIONS)}.")
    parser.add_argument("--repeats", type=int, default=None, help="Interleaved repeats per ratio (at least 3).")
    parser.add_argument("--out", type=Path, default=HERE, help="Folder of results.json and RESULTS.md.")
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU bf16 peak for the MFU (else a table).")
    parser.add_argument("--keep-data", action="store_true", help="Keep the runs' data root (printed).")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose among {', '.join(SECTIONS)}")
    if args.repeats is not None and args.repeats < 3:
        parser.error("--repeats must be at least 3 (the spread needs them)")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    args.sections = only or (["rollout", "update"] if args.device == "cuda" else list(SECTIONS))
    if args.device == "cuda" and set(args.sections) - {"rollout", "update"}:
        parser.error("--device cuda runs the rollout and update sections only (item 7); drop --only or pick those")
    return args


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = QUICK if args.quick else FULL
    if args.repeats is not None:
        from dataclasses import replace

        sizes = replace(sizes, repeats=args.repeats, repeats_override=args.repeats)
    return sizes


def _log(message: str, started: float) -> None:
    print(f"[bench {time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)


def run_sections(args: argparse.Namespace, data_root: Path, started: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Run the chosen sections in order (the flow first, so its memory is measured in a fresh process)."""
    from benchmarks import suite

    sizes, results, errors = _sizes(args), {}, {}
    runners = {
        "flow": lambda: suite.run_flow_section(sizes, data_root, args.threads),
        "peer": lambda: suite.run_peer_section(sizes, data_root, args.threads),
        "rollout": lambda: suite.run_rollout_section(sizes, args.device, args.threads),
        "update": lambda: suite.run_update_section(sizes, args.device, args.threads, args.peak_tflops),
        "group": lambda: suite.run_group_section(sizes, args.threads),
        "nodes": lambda: suite.run_nodes_section(sizes, args.threads),
        "lora": lambda: suite.run_lora_section(sizes, args.threads),
        "async": lambda: suite.run_async_section(sizes, data_root, args.threads),
        "host": lambda: suite.run_host_section(sizes, data_root),
        "lake": lambda: suite.run_lake_section(sizes),
        "view": lambda: suite.run_view_section(sizes),
        "vllm": lambda: suite.run_vllm_section(sizes, data_root, args.threads),
        "servers": lambda: suite.run_servers_section(sizes, data_root, args.threads),
        "store": lambda: suite.run_store_section(sizes, args.threads),
    }
    for name in SECTIONS:
        if name not in args.sections:
            continue
        _log(f"{name}: start", started)
        try:
            results[name] = runners[name]()
            _log(f"{name}: done", started)
        except Exception as exc:  # one failing section must not hide the others' results
            traceback.print_exc()
            errors[name] = f"{type(exc).__name__}: {exc}"
            _log(f"{name}: FAILED ({errors[name]})", started)
    return results, errors


def foreign_sections(text: str) -> str:
    """Marked sections other benchmarks wrote into RESULTS.md (``<!-- name:begin -->`` ... ``<!-- name:end -->``,
    e.g. benchmarks/gpu_update_bench.py's), kept when the report is regenerated; the lake's is ours."""
    import re

    blocks = re.findall(r"(<!-- ([\w.-]+):begin -->.*?<!-- \2:end -->)", text, flags=re.DOTALL)
    kept = [block for block, name in blocks if name != "lake_bench"]
    return "".join(f"\n{block}\n" for block in kept)


def write_outputs(out: Path, details: dict[str, Any]) -> None:
    """details.json (everything), results.json (flat), RESULTS.md (the report) and results/lake.json."""
    from benchmarks.markdown import render
    from benchmarks.report import flatten

    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / "details.json").write_text(json.dumps(details, indent=1, sort_keys=True, default=str) + "\n")
    (out / "results.json").write_text(json.dumps(flatten(details), indent=1, sort_keys=True) + "\n")
    previous = (out / "RESULTS.md").read_text() if (out / "RESULTS.md").is_file() else ""
    (out / "RESULTS.md").write_text(render(details) + foreign_sections(previous))
    lake = details.get("lake", {}).get("sizes", {})
    if lake:
        largest = lake[max(lake, key=int)]
        (out / "results" / "lake.json").write_text(json.dumps(largest, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    quiet_libraries(args.device)
    data_root = Path(tempfile.mkdtemp(prefix="ragen-bench-"))
    if not args.keep_data:  # registered before Prefect starts its server, so it runs after the server stops
        atexit.register(shutil.rmtree, data_root, True)
    if {"flow", "peer", "vllm"} & set(args.sections):
        from benchmarks.suite import prefect_home

        prefect_home(data_root)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda but torch sees no CUDA device; run on a GPU machine or drop --device",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    previous = args.out / "results" / "details.json"
    details = json.loads(previous.read_text()) if previous.is_file() else {}
    results, errors = run_sections(args, data_root, started)
    if args.device == "cuda":
        details["gpu"] = {**details.get("gpu", {}), **results}
    else:
        details.update(results)
    details.update(
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        quick=args.quick,
        device=args.device,
        threads=args.threads,
        total_seconds=time.perf_counter() - started,
        errors=errors,
    )
    write_outputs(args.out, details)
    _log(f"wrote {args.out / 'results.json'} and {args.out / 'RESULTS.md'}", started)
    if args.keep_data:
        _log(f"data root kept: {data_root}", started)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
