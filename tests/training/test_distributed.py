"""Data-parallel updates and precision: an update over 2 processes (torchrun, gloo, ZeRO-2) gives the in-process
weights; micro-batch sharding; the precision choice; the scale-out config checks; the bf16 engine path on CPU."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen_core.config import ActorConfig, AlgorithmConfig, ConfigError, build_config
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.training.actor import deepspeed_config
from ragen_core.training.distributed import free_port
from ragen_core.training.parallel import MicroBatchPlan, shard_micro_batches
from ragen_core.training.precision import PrecisionError, precision_config, resolve_precision
from tests.training.dp_update_script import ACTOR_CASES, fixed_batch, run_cases

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# -- micro-batch sharding ----------------------------------------------------------------------------------------
def test_one_rank_runs_every_micro_batch_in_order():
    rows = [7, 3, 5, 1, 0, 2, 6, 4]
    assert shard_micro_batches(rows, 3, 0, 1) == [
        MicroBatchPlan([7, 3, 5], 1.0),
        MicroBatchPlan([1, 0, 2], 1.0),
        MicroBatchPlan([6, 4], 1.0),
    ]


def test_ranks_split_micro_batches_and_pad_to_the_same_number_of_passes():
    rows = [7, 3, 5, 1, 0, 2, 6, 4]
    rank0, rank1 = shard_micro_batches(rows, 3, 0, 2), shard_micro_batches(rows, 3, 1, 2)
    assert rank0 == [MicroBatchPlan([7, 3, 5], 1.0), MicroBatchPlan([6, 4], 1.0)]
    assert rank1 == [MicroBatchPlan([1, 0, 2], 1.0), MicroBatchPlan([6, 4], 0.0)]  # padding: the smallest, weight 0
    real = [row for plans in (rank0, rank1) for plan in plans if plan.weight for row in plan.rows]
    assert sorted(real) == sorted(rows)  # every row trained exactly once over the ranks


def test_more_ranks_than_micro_batches_all_pad():
    assert shard_micro_batches([0, 1], 4, 2, 3) == [MicroBatchPlan([0, 1], 0.0)]
    with pytest.raises(ValueError, match="outside a world"):
        shard_micro_batches([0, 1], 4, 3, 3)


# -- precision ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requested", "cuda", "bf16", "expected"),
    [
        ("auto", False, False, "fp32"),
        ("auto", True, True, "bf16"),
        ("auto", True, False, "fp32"),
        ("fp32", True, True, "fp32"),
        ("bf16", True, True, "bf16"),
        ("fp16", True, False, "fp16"),
    ],
)
def test_precision_resolution(requested, cuda, bf16, expected):
    assert resolve_precision(requested, cuda_available=cuda, bf16_supported=bf16) == expected


@pytest.mark.parametrize(
    ("requested", "cuda", "bf16", "needle"),
    [
        ("bf16", False, False, "needs a CUDA GPU"),
        ("fp16", False, False, "needs a CUDA GPU"),
        ("bf16", True, False, "does not support"),
    ],
)
def test_half_precision_without_a_capable_gpu_is_refused(requested, cuda, bf16, needle):
    with pytest.raises(PrecisionError, match=needle):
        resolve_precision(requested, cuda_available=cuda, bf16_supported=bf16)


def test_deepspeed_precision_sections():
    assert precision_config("fp32", 2) == {}
    assert precision_config("bf16", 0) == {"bf16": {"enabled": True}}  # ZeRO-0 can only accumulate in bf16
    assert precision_config("bf16", 2) == {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
    fp16 = precision_config("fp16", 1)["fp16"]
    assert fp16["enabled"] and fp16["loss_scale"] == 0 and fp16["initial_scale_power"] == 16  # dynamic scaling
    config = deepspeed_config(OptimConfig(1e-3, 0.0, 1.0, 4, zero_stage=3, precision="bf16"))
    assert config["zero_optimization"] == {"stage": 3} and config["bf16"] == {"enabled": True}


def test_scale_out_config_is_checked_at_load_time():
    ok = build_config({}, ["trainer.launcher=torchrun", "trainer.nproc=2", "actor.zero_stage=2"])
    assert (ok.trainer.launcher, ok.trainer.nproc, ok.actor.zero_stage, ok.trainer.precision) == (
        "torchrun",
        2,
        2,
        "auto",
    )
    cases = [
        (["trainer.nproc=2"], "set trainer.launcher=torchrun or deepspeed"),
        (["trainer.launcher=torchrun", "trainer.nproc=2"], "needs actor.zero_stage 1, 2 or 3"),
        (["actor.zero_stage=3"], "set trainer.launcher=torchrun or deepspeed"),
        (["trainer.hostfile=hosts"], "needs the DeepSpeed launcher"),
        (["trainer.launcher=mpirun"], "trainer.launcher"),
    ]
    for overrides, needle in cases:
        with pytest.raises(ConfigError, match=needle):
            build_config({}, overrides)
    # a config is valid or not wherever it is read: bf16 is planned on a CPU head node too (the machine is checked
    # when a command starts, see tests/cli/test_cli.py)
    assert build_config({}, ["trainer.precision=bf16"]).trainer.precision == "bf16"


def test_bf16_engine_steps_with_fp32_master_weights(tiny_policy):
    """The GPU precision path, run on DeepSpeed's CPU accelerator (bf16 works there; the commands still refuse
    bf16 without CUDA): bf16 weights, an update close to the fp32 one, a finite unscaled gradient norm."""
    model, tokenizer = tiny_policy
    batch, scores, groups = fixed_batch(tokenizer.pad_token_id)
    from ragen_core.algos import grpo_advantage
    from ragen_core.update.advantages import trajectory_token_rewards

    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    algorithm = AlgorithmConfig(
        policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001, loss_agg_mode="token-mean"
    )
    schedule = ActorConfig(mini_batch_size=8, ppo_epochs=1)
    results = {}
    for precision in ("fp32", "bf16"):
        optim = OptimConfig(0.5, 0.0, 1.0, 3, zero_stage=1, optimizer="sgd", precision=precision)
        actor = ActorEngine(copy.deepcopy(model), optim)
        metrics = actor.policy_update(batch, advantages, actor.score(batch), algorithm, schedule, 0)
        results[precision] = (actor, metrics)
    (fp32, fp32_metrics), (bf16, bf16_metrics) = results["fp32"], results["bf16"]
    assert next(bf16.module.parameters()).dtype == torch.bfloat16
    assert type(bf16.engine.optimizer).__name__ == "BF16_Optimizer"  # fp32 master weights and gradient accumulation
    assert bf16_metrics["actor/grad_norm"] == pytest.approx(fp32_metrics["actor/grad_norm"], rel=0.05)
    start = dict(model.named_parameters())
    for (name, a), (_, b) in zip(fp32.module.named_parameters(), bf16.module.named_parameters(), strict=True):
        step = (a - start[name]).norm()
        if step > 1e-3:  # parameters the update moved: bf16 lands on the fp32 result up to bf16 rounding
            assert (b.float() - a).norm() / a.norm() < 2e-2, name


# -- the update over 2 processes ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_rank_group(tmp_path_factory, tiny_model_dir):
    """One 2-process group (torchrun, gloo) running the cases under ZeRO-2, then under ZeRO-3; its output folder."""
    out = tmp_path_factory.mktemp("dp")
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env["PYTHONPATH"] = str(REPO)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(Path(__file__).with_name("dp_update_script.py")),
        str(tiny_model_dir),
        str(out),
        "2,3",
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def two_rank_results(request, two_rank_group):
    stage = request.param
    return {
        **torch.load(two_rank_group / f"zero{stage}.pt", weights_only=False),
        "export": two_rank_group / f"export-zero{stage}",
        "stage": stage,
    }


@pytest.fixture(scope="module")
def in_process_results(tiny_policy):
    model, tokenizer = tiny_policy
    return run_cases(model, tokenizer, zero_stage=0)


@pytest.mark.process  # a 2-rank torchrun group
@pytest.mark.parametrize("case", [name for name, *_ in ACTOR_CASES] + ["critic"])
def test_two_rank_update_equals_the_in_process_update(two_rank_results, in_process_results, tiny_policy, case):
    """Same batch, same start weights: the update over 2 ranks (gloo, ZeRO-2 and ZeRO-3, a padding pass on one rank)
    and the in-process one (one process, ZeRO-0) agree on every parameter to 1e-5 relative, and on the metrics."""
    assert two_rank_results["world_size"] == 2
    model, _ = tiny_policy
    expected, actual = in_process_results[case], two_rank_results["results"][case]
    assert expected["weights"].keys() == actual["weights"].keys()
    # SGD (and the critic) are linear in the gradient, whose sum over tokens the ranks add in another order: the
    # float32 error is relative to the tensor's update, not to the weight (an embedding row near 0 that many tokens
    # touch moved 2.3e-7 off where the largest step was 3.8e-2: 6e-6 of it), so the floor is 1e-4 of the largest
    # step. AdamW divides each gradient by its own running magnitude, so where the true gradient is ~0 (the
    # key-projection bias gets exactly 0: softmax ignores a shift shared by all keys) float noise in the reduction
    # moves the weight by up to ~lr: there the floor is 5e-3 * lr absolute (observed at lr 1e-3: 2e-7 with ZeRO-2,
    # 1.1e-6 and, with another tiny model's weights, 2.1e-6 with ZeRO-3, on one element of 16384); an update that
    # is wrong moves weights by ~lr, 200x more.
    moved = 0
    start = dict(model.named_parameters())
    for name, want in expected["weights"].items():
        step = float((want - start[name]).abs().max()) if name in start else 0.0
        atol = 5e-6 if case.startswith("adamw") else max(1e-7, 1e-4 * step)
        torch.testing.assert_close(
            actual["weights"][name], want, rtol=1e-5, atol=atol, msg=lambda found, name=name: f"{name}: {found}"
        )
        moved += int(name in start and not torch.equal(want, start[name]))
    assert case == "critic" or moved > 10  # the update did move the policy
    for key, value in expected["metrics"].items():  # ppo_kl is a difference of log-probs: looser, by cancellation
        assert actual["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.process  # a 2-rank torchrun group
def test_the_policy_export_gathers_the_whole_model(two_rank_results):
    """The rollout side's Hugging Face export, written by the 2-rank group (under ZeRO-3 gathered from the
    partitions), holds exactly the group's weights and loads into a fresh model."""
    from transformers import AutoModelForCausalLM

    from ragen_core.training.checkpoint import load_exported_weights

    folder = two_rank_results["export"]
    weights = two_rank_results["results"][ACTOR_CASES[0][0]]["weights"]
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, weights[name]), name
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.zero_()
    load_exported_weights(fresh, folder)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))
