"""Exact resume of a LoRA run (actor.lora, with adapter dropout and a KL term): killed inside an update and mid
checkpoint save, then resumed, it ends with bitwise the same adapters and the same rows as the run that never
stopped; its rows were sampled in process from the learner's PEFT module. Its checkpoints are `lora` rows, read back
as the adapters on the run's start model (tests/flows/test_lora_policy.py: what eval, retrain and export do with
them)."""

import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake, query
from ragen_core.storage.trust import checkpoint_folder
from tests.flows.test_resume import RUN, _overrides, _ragen, _rows

FAULTS = ["update:inside@1", "checkpoint:mid_save@2"]
LORA = ["actor.lora.rank=4", "actor.lora.dropout=0.1", "algorithm.kl_coef=0.01", "actor.lr=0.01"]


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, tiny_model_dir, tiny_policy, prefect_server):
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: build it here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir), *LORA]
    api_url = prefect_server[0].api_url
    whole = tmp_path_factory.mktemp("whole-lora")
    rc, output = _ragen(train, whole, None, api_url)
    assert rc == 0, output[-3000:]
    killed = tmp_path_factory.mktemp("killed-lora")
    for attempt, fault in enumerate(FAULTS):
        rc, output = _ragen(train if attempt == 0 else ["resume", RUN], killed, fault, api_url)
        assert rc == -signal.SIGKILL, f"{fault}: exit {rc}\n{output[-3000:]}"
    rc, output = _ragen(["resume", RUN], killed, None, api_url)
    assert rc == 0, output[-3000:]
    assert "resumed at iteration" in output
    return whole, killed


def _adapters(root):
    folder = DataLake(root).root / "runs" / RUN / "checkpoints" / "iteration=3"
    assert not (folder / "hf").exists()
    return load_file(folder / "adapter" / "adapter_model.safetensors")


def test_final_adapters_are_bitwise_identical(lora_runs):
    whole, killed = lora_runs
    expected, actual = _adapters(whole), _adapters(killed)
    assert expected.keys() == actual.keys() and all("lora_" in name for name in expected)
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    assert any(name.endswith("lora_B.weight") and expected[name].abs().sum() > 0 for name in expected)  # trained


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_tables_hold_exactly_the_same_rows(lora_runs, table):
    whole, killed = lora_runs
    expected, actual = _rows(whole, table), _rows(killed, table)
    assert len(actual) == len(set(actual)) == len(expected)
    assert actual == expected
    if table == "metrics":
        assert any("actor/kl_loss" in row for row in actual)  # the adapters-off reference took part


def test_the_checkpoints_are_lora_rows_read_back_as_adapters_on_the_start_model(lora_runs, tmp_path):
    from ragen_core.run.evaluation import resolve_target
    from ragen_core.run.offline import StartPolicy, resolve_init

    _, killed = lora_runs
    lake = DataLake(killed)
    manifest = lake.read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == len(FAULTS)
    rows = query(lake, "SELECT iteration, format, path, available FROM checkpoints ORDER BY iteration, format")
    assert [(r["iteration"], r["format"], r["available"]) for r in rows.to_pylist()] == [
        (1, "deepspeed", True),
        (1, "lora", True),
        (2, "deepspeed", True),
        (2, "lora", True),
    ]
    folder = lake.checkpoint_dir(RUN, 3)
    assert {checkpoint_folder(lake.root, RUN, path, killed) for path in rows["path"].to_pylist()} == {
        lake.checkpoint_dir(RUN, 2),
        folder,
    }
    policy = StartPolicy(Path(manifest.model_dir), folder / "adapter")  # the adapters on the run's start model
    for target in (f"run:{RUN}@3", str(folder), str(folder / "adapter")):
        assert resolve_init(target, lake) == policy
    assert resolve_target(RUN, lake)[::2] == (policy, f"{RUN}@3")
