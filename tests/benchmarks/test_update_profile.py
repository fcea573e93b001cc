"""The update profile of the device check (benchmarks/update_profile.py): the kinds, the interval union, the summary's
arithmetic, and a real profiled update of a DeepSpeed engine on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.update_profile import from_profiler, kind_of, markdown, profiled_call, summarize, union_seconds
from ragen_core.config import ActorConfig, AlgorithmConfig
from ragen_core.training import ActorEngine, OptimConfig
from tests.flows.test_resume import _wait_then_reap
from tests.training.test_micro_batches import sampled_bandit_batch


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT", "matmul"),
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("fmha_cutlassB_f32_aligned_64x64_k64_sm80", "attention"),  # "cutlass" too: attention is matched first
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("aten::_foreach_addcdiv_", "optimizer"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
        ("void at::native::reduce_scatter_kernel", "collective"),  # not a copy, though its name holds "cat"
        ("Memcpy HtoD (Pageable -> Device)", "copy"),
        ("aten::copy_", "copy"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>", "copy"),
        ("aten::cat", "copy"),
        ("aten::mul", "other"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda>", "other"),
    ],
)
def test_kinds_by_name(name, kind):
    assert kind_of(name) == kind


def test_union_of_intervals_by_hand():
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 2), (1, 3)]) == 3  # overlap counted once
    assert union_seconds([(5, 6), (0, 1), (0.5, 0.75)]) == 2  # unsorted, one nested in another
    assert union_seconds([(0, 1), (1, 2), (4, 5)]) == 3  # touching intervals, then a gap


def test_summary_arithmetic_by_hand():
    items = [("aten::mm", 0.3), ("aten::mm", 0.1), ("flash_fwd_kernel", 0.2), ("aten::mul", 0.4)]
    summary = summarize(items, wall_s=2.0, device="cuda", busy_s=0.8, optimizer_s=0.05, top=2)
    assert summary["work_s"] == pytest.approx(1.0)
    assert summary["busy_share"] == pytest.approx(0.4)
    assert summary["kinds"]["matmul"] == {"s": pytest.approx(0.4), "share": pytest.approx(0.4)}
    assert summary["kinds"]["attention"]["share"] == pytest.approx(0.2)
    assert summary["kinds"]["other"]["share"] == pytest.approx(0.4)
    assert summary["kinds"]["optimizer"]["s"] == 0.0
    # the top names: summed over their calls, largest first, cut at `top`
    assert [(row["name"], row["calls"]) for row in summary["top"]] == [("aten::mm", 2), ("aten::mul", 1)]
    assert summary["top"][0]["s"] == pytest.approx(0.4)
    text = markdown(summary)
    assert "GPU busy 40.0% of the wall time" in text and "optimizer step 0.050 s" in text
    assert markdown({}).startswith("No update was profiled")


def test_cpu_summary_has_no_busy_share():
    summary = summarize([("aten::mm", 1.0)], wall_s=1.5, device="cpu")
    assert summary["busy_s"] is None and summary["busy_share"] is None
    assert "busy" not in markdown(summary)


@pytest.mark.slow  # a profiled DeepSpeed update: 30-100 s
def test_a_real_update_is_profiled_on_its_call_only(tiny_policy):
    """Two policy updates of a DeepSpeed engine on the CPU: only the second is traced; its operators' own times
    add up to (nearly all of) the update's wall time, the GEMMs and the optimizer step are found."""
    model, _ = tiny_policy
    batch, advantages = sampled_bandit_batch(*tiny_policy, max_new_tokens=16, seed=3)
    optim = OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=8)
    actor = ActorEngine(copy.deepcopy(model), optim)
    old = actor.score(batch)
    algorithm, schedule = AlgorithmConfig(), ActorConfig(mini_batch_size=4)
    result: dict = {}
    with profiled_call(ActorEngine, "policy_update", 2, result):
        actor.policy_update(batch, advantages, old, algorithm, schedule, shuffle_seed=0)
        assert result == {}  # the first call is not traced
        metrics = actor.policy_update(batch, advantages, old, algorithm, schedule, shuffle_seed=1)
    assert metrics["actor/optimizer_steps"] == 2.0  # the traced call still did its work
    assert result["call"] == 2 and result["device"] == "cpu" and result["traced"] == "ActorEngine.policy_update"
    assert 0 < result["work_s"] <= result["wall_s"] * 1.05  # self times of one thread: within the wall time
    assert sum(entry["s"] for entry in result["kinds"].values()) == pytest.approx(result["work_s"])
    assert result["kinds"]["matmul"]["s"] > 0
    assert 0 < result["optimizer_step_s"] < result["wall_s"]  # two AdamW steps, inside the update
    assert ActorEngine.policy_update.__name__ == "policy_update"  # the class is restored after the block
    assert "in no operator (the host's own work)" in markdown(result)


def test_from_profiler_reads_a_cpu_trace():
    """A bare trace of known work: the matmuls are the GEMMs, the profile's work is within its wall time."""
    a = torch.randn(256, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(4):
            a = torch.mm(a, a).tanh()
    summary = from_profiler(profiler, wall_s=10.0, device="cpu")
    names = {row["name"] for row in summary["top"]}
    assert {"aten::mm", "aten::tanh"} <= names
    mm = next(row for row in summary["top"] if row["name"] == "aten::mm")
    assert mm["calls"] == 4 and mm["kind"] == "matmul"
    assert summary["optimizer_step_s"] is None


@pytest.mark.process  # the bench in a subprocess
def test_the_bench_profiles_its_second_update_stage_and_counts_the_flops_it_ran(tmp_path):
    """`gpu_update_bench --profile` on the CPU (tiny shape): the in-process update stage of iteration 1 is traced,
    and the bench's FLOPs count no re-scoring pass where the run took the sampler's log-probs (fp32 on the CPU: the
    run then records the behaviour log-prob gap), checked against 6 x parameters x tokens by hand."""
    import json
    import subprocess
    import sys

    import pyarrow.compute as pc

    from benchmarks.gpu_update_bench import measure
    from benchmarks.models import model_dir, parameter_count
    from ragen_core.policy import load_policy
    from ragen_core.storage import DataLake

    root, out = tmp_path / "root", tmp_path / "profile"
    command = [
        sys.executable,
        "-m",
        "benchmarks.gpu_update_bench",
        "--shape",
        "tiny",
        "--iterations",
        "2",
        "--peak-tflops",
        "1",
        "--no-report",
        "--root",
        str(root),
        "--profile",
        str(out),
    ]
    log = tmp_path / "bench.log"
    with log.open("w") as sink:  # its own session: whatever it leaves (a Prefect server) is reaped with it
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_then_reap(process, timeout=600)
    assert process.returncode == 0, log.read_text()[-4000:]
    profile = json.loads((out / "profile.json").read_text())
    assert (profile["traced"], profile["call"], profile["device"]) == ("InProcessUpdater.update", 2, "cpu")
    assert sum(entry["s"] for entry in profile["kinds"].values()) == pytest.approx(profile["work_s"])
    assert profile["kinds"]["matmul"]["s"] > 0
    assert "Profiled `InProcessUpdater.update`" in (out / "profile.md").read_text()

    lake = DataLake(root)
    parameters = parameter_count(load_policy(model_dir("tiny"))[0])
    rows = measure(root, "gpu-bench", parameters, 1, 1.0)["iterations"]
    assert [row["iteration"] for row in rows] == [0, 1]
    for row in rows:
        stored = lake.read_table("metrics", "gpu-bench", row["iteration"]).to_pylist()
        metrics = {r["name"]: r["value"] for r in stored}
        assert "actor/behavior_logprob_gap" in metrics and row["rescored"] is False  # fp32: the sampler's were taken
        table = lake.read_table("trajectories", "gpu-bench", row["iteration"])
        kept = table.filter(pc.and_(pc.equal(table["split"], "train"), pc.equal(table["kept"], True)))
        tokens = sum(len(ids) for ids in kept["input_ids"].to_pylist())
        assert row["tflops"] == pytest.approx(6 * parameters * tokens / metrics["time/update"] / 1e12)
