"""The device check's report (device/report.py) from planted result files: the launched and LoRA ratios by hand,
the LoRA and multi-turn benches and the profile when their steps ran, the steps of every call; and the bundle's pins
(device/pins.txt against device/depcheck.py's packages left out)."""

from __future__ import annotations

import json

from benchmarks.update_profile import summarize
from device import bundle, depcheck, report


def _bench(path, launcher, case, update_s):
    rows = [
        {
            "iteration": i,
            "update_s": s,
            "trained_tokens_per_s": 1000.0 / s,
            "tokens_per_s": 3000.0 / s,
            "tflops": 100.0 / s,
            "mfu": 0.1 / s,
        }
        for i, s in enumerate(update_s)
    ]
    path.write_text(
        json.dumps(
            {
                "machine": {"gpu": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2.11.0", "deepspeed": "0.19.8"}},
                "parameters": 470e6,
                "run": {"precision": "bf16", "iterations": rows},
                "launcher": launcher,
                "world": 1,
                "iterations": len(rows),
                "case": case,
                "rollouts": "synthetic",
                "peak_tflops": 989.0,
            }
        )
    )


def test_the_section_from_two_calls_files(tmp_path):
    machine = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "peft": "0.21.2 (carried)"}
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    _bench(tmp_path / "bench-inprocess.json", "inprocess", "bandit", [5.0, 1.0, 2.0])  # steady: 1.5 s
    _bench(tmp_path / "bench-lora.json", "inprocess", "bandit", [4.0, 0.8, 1.5])  # steady: 1.15 s
    _bench(tmp_path / "bench-torchrun.json", "torchrun", "bandit", [9.0, 1.5, 2.1])  # steady: 1.8 s
    _bench(tmp_path / "bench-sokoban.json", "inprocess", "sokoban", [4.0, 2.0])
    (tmp_path / "profile").mkdir()
    profile = summarize([("nvjet_gemm", 0.3), ("aten::mul", 0.1)], wall_s=1.0, device="cuda", busy_s=0.4)
    (tmp_path / "profile" / "profile.json").write_text(json.dumps({**profile, "call": 2, "case": "bandit"}))
    (tmp_path / "summary.txt").write_text("tests     rc=0\n")
    (tmp_path / "summary-all.txt").write_text("10:00:00 bench     rc=0\n10:09:00 tests     rc=0\n")
    text = report.section(tmp_path)
    assert "**NVIDIA H100 80GB HBM3**" in text
    assert "Launched / in-process steady update time**: 1.20" in text  # 1.8 / 1.5
    assert "in-process**: steady update 1.50 s" in text
    lora = "gpu_update_bench `--lora-rank 8` (LoRA rank 8), in-process**: steady update 1.15 s"
    assert f"{lora}, 95.8 TFLOP/s, MFU 9.6%." in text  # means of 100 / 0.8 and 100 / 1.5, of 0.1 / 0.8 and 0.1 / 1.5
    assert "| 1 | 0.80 | 1,250 | 3,750 | 125.0 | 12.5% |" in text  # its per-iteration table
    assert "LoRA rank 8 / full fine-tuning steady update time**: 0.77" in text  # 1.15 / 1.5
    assert text.index("in-process**: steady update 1.50 s") < text.index(lora) < text.index("torchrun --nproc 1`**")
    assert "PEFT 0.21.2 (carried)" in text
    assert "`--case sokoban` (multi-turn rows), in-process**: steady update 2.00 s" in text
    assert "Where one update's time goes" in text and "GPU busy 40.0% of the wall time" in text
    assert "10:00:00 bench" in text and "10:09:00 tests" in text  # every call's steps, not this call's alone


def test_steps_that_did_not_run_leave_no_figure(tmp_path):
    _bench(tmp_path / "bench-inprocess.json", "inprocess", "bandit", [5.0, 1.0])
    (tmp_path / "summary.txt").write_text("bench     rc=0\n")
    text = report.section(tmp_path)
    assert "Launched / in-process" not in text  # no launched bench: no ratio
    assert "Where one update's time goes" not in text
    assert "LoRA" not in text and "PEFT" not in text  # no lora step, no machine.json: no LoRA row, no ratio
    assert "bench     rc=0" in text
    assert report.launched_ratio(tmp_path / "bench-inprocess.json", tmp_path / "missing.json") is None


def test_the_lora_row_without_the_full_bench_has_no_ratio(tmp_path):
    _bench(tmp_path / "bench-lora.json", "inprocess", "bandit", [3.0, 0.5])
    text = report.section(tmp_path)
    assert "(LoRA rank 8), in-process**: steady update 0.50 s" in text
    assert "gpu_update_bench, in-process**: no result" in text  # the full bench's own line says it is missing
    assert "/ full fine-tuning" not in text
    assert report.update_ratio(tmp_path / "missing.json", tmp_path / "bench-lora.json") is None


def test_peft_is_carried_not_left_out():
    pins = dict(bundle.read_pins(bundle.HERE / "pins.txt"))
    assert pins["peft"] == "0.21.2"
    assert "peft" not in depcheck.LEFT_OUT
    carried = {depcheck.canonical(name) for name in pins}
    fallback = {depcheck.canonical(name) for name, _ in bundle.read_pins(bundle.HERE / "pins-fallback.txt")}
    assert not carried & depcheck.LEFT_OUT  # nothing carried is also reported as left out on purpose
    assert not carried & fallback  # one place each
    assert "psutil" in fallback  # PEFT's requirement that the image may lack
