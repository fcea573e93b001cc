"""The device check's figures, from the files its steps left in ``$OUT``.

    python report.py train DATA_ROOT RUN_ID SECONDS OUT/train.json   # a finished `ragen train`: success, time
    python report.py results OUT PROJ                                 # OUT/RESULTS-gpu.md and OUT/RESULTS.md

``results`` writes the "GPU device check" section (the machine, the gpu tests' outcome, the update benchmark in
process, with LoRA adapters of rank 8, launched and on multi-turn Sokoban rows, the profiled update, the short train;
the steps of every call with this bundle) as ``OUT/RESULTS-gpu.md``, and ``OUT/RESULTS.md``: the carried project's
``benchmarks/RESULTS.md`` with that section put between its ``device_check`` markers, ready to commit. Run with the
project on ``PYTHONPATH`` (it reads the benchmark's own table layout).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- device_check:begin -->", "<!-- device_check:end -->"
LORA_RANK = 8  # run.sh's lora step: gpu_update_bench --lora-rank 8 (the result file does not name the rank)


def train_figures(root: Path, run_id: str, seconds: float) -> dict[str, Any]:
    """Validation success per env at the first and last validated iteration of a finished run, and its time."""
    from ragen_core.storage import DataLake, query

    rows = query(
        root,
        "SELECT env, iteration, avg(success::int) AS success, count(*) AS n FROM trajectories "
        f"WHERE split = 'val' AND run_id = '{run_id}' GROUP BY 1, 2 ORDER BY 1, 2",
    ).to_pylist()
    success: dict[str, dict[str, float]] = {}
    for row in rows:
        success.setdefault(row["env"], {})[str(row["iteration"])] = row["success"]
    manifest = DataLake(root).read_manifest(run_id)
    status, precision = (manifest.status, manifest.precision) if manifest is not None else (None, None)
    return {
        "run_id": run_id,
        "status": status,
        "precision": precision,
        "seconds": seconds,
        "validation_success": success,
    }


def _bench_lines(path: Path, title: str) -> list[str]:
    from benchmarks.gpu_update_bench import markdown

    if not path.is_file():
        return [f"**{title}**: no result (see log.txt).", ""]
    result = json.loads(path.read_text())
    steady = [row for row in result["run"]["iterations"] if row["iteration"] > 0] or result["run"]["iterations"]
    update_s = sum(row["update_s"] for row in steady) / len(steady)
    tflops = sum(row["tflops"] for row in steady) / len(steady)
    mfu = [row["mfu"] for row in steady if row["mfu"] is not None]
    text = markdown(result).replace("## GPU update", "#### GPU update")
    summary = (
        f"**{title}**: steady update {update_s:.2f} s, {tflops:.1f} TFLOP/s"
        + (f", MFU {sum(mfu) / len(mfu):.1%}" if mfu else "")
        + "."
    )
    return [summary, "", text]


def _profile_lines(path: Path) -> list[str]:
    """The profiled update's figures (benchmarks/update_profile.py), or nothing when the step did not run."""
    from benchmarks.update_profile import markdown

    if not path.is_file():
        return []
    profile = json.loads(path.read_text())
    title = f"**Where one update's time goes** (`--profile`, {profile.get('case', 'bandit')} batch)"
    return [title, "", markdown(profile)]


def steady_update_s(path: Path) -> float | None:
    """Mean update seconds of a bench result's iterations after the first (the first one if there is no other)."""
    if not path.is_file():
        return None
    rows = json.loads(path.read_text())["run"]["iterations"]
    steady = [row for row in rows if row["iteration"] > 0] or rows
    return sum(row["update_s"] for row in steady) / len(steady) if steady else None


def update_ratio(base: Path, other: Path) -> float | None:
    """``other``'s steady update time over ``base``'s (None unless both ran)."""
    ours, theirs = steady_update_s(other), steady_update_s(base)
    return ours / theirs if ours is not None and theirs else None


def launched_ratio(inprocess: Path, launched: Path) -> float | None:
    """The launched group's steady update time over the in-process one (None unless both ran)."""
    return update_ratio(inprocess, launched)


def _lora_lines(out: Path) -> list[str]:
    """The LoRA bench beside the full fine-tuning one, or nothing when its step did not run. The bench counts a
    full update's FLOPs (6 N per token) either way, so its TFLOP/s and MFU compare the two update times."""
    path = out / "bench-lora.json"
    if not path.is_file():
        return []
    lines = _bench_lines(path, f"gpu_update_bench `--lora-rank {LORA_RANK}` (LoRA rank {LORA_RANK}), in-process")
    ratio = update_ratio(out / "bench-inprocess.json", path)
    if ratio is not None:
        lines += [
            f"**LoRA rank {LORA_RANK} / full fine-tuning steady update time**: {ratio:.2f} (the same batch; the "
            "LoRA TFLOP/s and MFU count a full update's FLOPs, so they compare the times).",
            "",
        ]
    return lines


def section(out: Path) -> str:
    """The "GPU device check" section from what ``out`` holds."""
    steps = out / "summary-all.txt" if (out / "summary-all.txt").is_file() else out / "summary.txt"
    summary = steps.read_text() if steps.is_file() else ""
    env = (out / "machine.json").read_text() if (out / "machine.json").is_file() else "{}"
    machine = json.loads(env)
    tests = (out / "gpu-tests-summary.txt").read_text().strip() if (out / "gpu-tests-summary.txt").is_file() else ""
    lines = [
        "## GPU device check (`device/run.sh`)",
        "",
        f"Run {time.strftime('%Y-%m-%d', time.gmtime())} on **{machine.get('gpu') or 'no GPU (CPU stand-in)'}**, "
        f"torch {machine.get('torch')}, transformers {machine.get('transformers')}, "
        f"DeepSpeed {machine.get('deepspeed')}, "
        + (f"PEFT {machine['peft']}, " if machine.get("peft") else "")
        + f"Python {machine.get('python')}.",
        "",
        f"- `pytest -m gpu tests/gpu`: {tests or 'no summary (see log.txt)'}",
        "",
    ]
    lines += _bench_lines(out / "bench-inprocess.json", "gpu_update_bench, in-process")
    lines += _lora_lines(out)
    lines += _bench_lines(out / "bench-torchrun.json", "gpu_update_bench, `--launcher torchrun --nproc 1`")
    ratio = launched_ratio(out / "bench-inprocess.json", out / "bench-torchrun.json")
    if ratio is not None:
        lines += [f"**Launched / in-process steady update time**: {ratio:.2f} (the same work; target <= 1.2).", ""]
    sokoban = "gpu_update_bench `--case sokoban` (multi-turn rows), in-process"
    lines += _bench_lines(out / "bench-sokoban.json", sokoban)
    lines += _profile_lines(out / "profile" / "profile.json")
    train = out / "train.json"
    if train.is_file():
        figures = json.loads(train.read_text())
        parts = [
            f"{env} {min(s.items(), key=lambda kv: int(kv[0]))[1]:.3f} -> "
            f"{max(s.items(), key=lambda kv: int(kv[0]))[1]:.3f}"
            for env, s in figures["validation_success"].items()
        ]
        lines += [
            f"**`ragen train --config configs/bandit.yaml`** ({figures['precision']}): validation success "
            f"{'; '.join(parts)} in {figures['seconds']:.0f} s ({figures['status']}).",
            "",
        ]
    lines += ["Steps (rc, time limit, seconds; every call with this bundle):", "", "```", summary.strip(), "```", ""]
    return "\n".join(lines)


def results(out: Path, proj: Path) -> None:
    """Write ``out/RESULTS-gpu.md`` and ``out/RESULTS.md`` (the project's report with the section in place)."""
    from benchmarks.common import replace_marked_section

    text = section(out)
    (out / "RESULTS-gpu.md").write_text(text)
    report = out / "RESULTS.md"
    source = proj / "benchmarks" / "RESULTS.md"
    report.write_text(source.read_text() if source.is_file() else "# Benchmark results\n")
    replace_marked_section(report, BEGIN, END, text)


def main(argv: list[str]) -> int:
    """Command line (see the module docstring); errors in one line on stderr."""
    try:
        if argv[:1] == ["train"] and len(argv) == 5:
            figures = train_figures(Path(argv[1]), argv[2], float(argv[3]))
            Path(argv[4]).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
            print(json.dumps(figures, sort_keys=True))
        elif argv[:1] == ["results"] and len(argv) == 3:
            results(Path(argv[1]), Path(argv[2]))
            print((Path(argv[1]) / "RESULTS-gpu.md").read_text())
        else:
            print("usage: report.py train ROOT RUN_ID SECONDS OUT.json | report.py results OUT PROJ", file=sys.stderr)
            return 2
    except Exception as exc:  # noqa: BLE001 - one line for the log; the step's rc says it failed
        print(f"report: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
