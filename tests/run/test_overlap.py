"""Asynchronous StarPO through the Python API (``trainer.max_staleness``): which policy samples which batch is the
schedule's (checked against rollouts sampled here, in this process, by the policy the schedule names), the
staleness is a column and a contract, an early stop drops the batches sampled ahead, and what an async run cannot do
is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ragen_core
from ragen_core.config import RunConfig
from ragen_core.policy import load_policy
from ragen_core.rollout import run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.run.decisions import ResumeError
from ragen_core.run.session import chat_formatter
from ragen_core.run.stages import rollout_spec, sampling_version
from ragen_core.seeding import derive_seed, derive_seeds
from ragen_core.storage import DataLake
from ragen_core.storage.layout import CHECKPOINT_HF

RUN = "async"


def _config(model_dir: Path, staleness: int, iterations: int = 3, **trainer) -> dict:
    return {
        "seed": 5,
        "model": {"path": str(model_dir)},
        "env": {"name": "bandit", "val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 8, "micro_batch_size": 4},
        "trainer": {
            "iterations": iterations,
            "checkpoint_every": 1,
            "keep_last": 10,
            "num_threads": 1,
            "max_staleness": staleness,
            **trainer,
        },
        "eval": {"every": 10, "instances": 2},
        "bootstrap": {"enabled": False},
        "monitor": {"truncated_share": None},
    }


@pytest.fixture(scope="module")
def async_run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("async")
    config = _config(tiny_model_dir, 1)
    seen: list[int] = []
    result = ragen_core.train(config, root, RUN, progress=lambda i, metrics: seen.append(i))
    assert result.status == "completed" and seen == [0, 1, 2, 3]
    return root, RunConfig.model_validate(config)


def _batch(root: Path, iteration: int) -> list[tuple]:
    rows = ragen_core.query(
        "SELECT group_id, traj_index, input_ids, behavior_logprobs, policy_version FROM trajectories "
        f"WHERE split = 'train' AND iteration = {iteration} ORDER BY group_id, traj_index",
        root,
    ).to_pylist()
    return [(r["input_ids"], r["behavior_logprobs"], r["policy_version"]) for r in rows]


def _sampled_here(config: RunConfig, model_dir: Path, iteration: int) -> list[tuple]:
    """Iteration ``iteration``'s training rollouts as the policy in ``model_dir`` samples them in this process, with
    one thread as the run's sampler process (the same kernels, so the same bits)."""
    model, tokenizer = load_policy(model_dir)
    seeds = derive_seeds(config.seed, config.rollout.env_groups, iteration, "env_seeds")
    spec = rollout_spec(config, config.env.name, seeds, config.rollout.group_size, "train")
    backend = HFBackend(model, tokenizer, 1.0, config.rollout.max_new_tokens)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        records = run_rollouts(
            spec, backend, chat_formatter(config, tokenizer), derive_seed(config.seed, iteration, "rollout")
        )
    finally:
        torch.set_num_threads(threads)
    return [(r.input_ids, r.behavior_logprobs, sampling_version(iteration, 1)) for r in records]


def _checkpoint(root: Path, updates: int) -> Path:
    return DataLake(root).root / "runs" / RUN / "checkpoints" / f"iteration={updates}" / CHECKPOINT_HF


def test_each_batch_is_sampled_by_the_policy_the_schedule_names(async_run, tiny_model_dir):
    root, config = async_run
    # k = 1: batches 0 and 1 by the start policy, batch 2 by the policy after update 1 (its checkpoint's export)
    assert _batch(root, 0) == _sampled_here(config, tiny_model_dir, 0)
    assert _batch(root, 1) == _sampled_here(config, tiny_model_dir, 1)
    after_one = _sampled_here(config, _checkpoint(root, 1), 2)
    assert _batch(root, 2) == after_one
    # ... and not by the start policy, nor by the policy after update 2 (the one a synchronous run would use)
    assert _batch(root, 2) != _sampled_here(config, tiny_model_dir, 2)
    assert _batch(root, 2) != _sampled_here(config, _checkpoint(root, 2), 2)


def test_the_staleness_is_a_column_and_a_metric(async_run):
    root, _ = async_run
    rows = ragen_core.query(
        "SELECT split, iteration, min(policy_version) AS low, max(policy_version) AS high FROM trajectories "
        "GROUP BY ALL ORDER BY ALL",
        root,
    ).to_pylist()
    train = {r["iteration"]: (r["low"], r["high"]) for r in rows if r["split"] == "train"}
    val = {r["iteration"]: (r["low"], r["high"]) for r in rows if r["split"] == "val"}
    assert train == {0: (0, 0), 1: (0, 0), 2: (1, 1)}  # max(0, i - 1)
    assert val == {0: (0, 0), 3: (3, 3)}  # validation measures the policy after i updates, as ever
    staleness = ragen_core.query(
        "SELECT iteration, value FROM metrics WHERE name = 'rollout/staleness' ORDER BY iteration", root
    ).to_pylist()
    assert [(r["iteration"], r["value"]) for r in staleness] == [(0, 0.0), (1, 1.0), (2, 1.0)]
    waits = ragen_core.query(
        "SELECT count(*) AS n FROM metrics WHERE name IN ('time/learner_wait', 'time/sampler_wait')", root
    ).to_pylist()
    assert waits == [{"n": 4}]  # steps 0 and 1 sampled a batch ahead; step 2 had none left to sample


def test_an_async_run_is_not_extended_and_a_second_run_is_bitwise_the_first(async_run, tiny_model_dir, tmp_path):
    root, _ = async_run
    with pytest.raises(ResumeError, match=r"cannot be extended asynchronously \(trainer.max_staleness=1\)"):
        ragen_core.train(_config(tiny_model_dir, 1, iterations=5), root, RUN, force_config=["trainer.iterations"])
    again = ragen_core.train(_config(tiny_model_dir, 1), tmp_path, RUN)
    assert again.status == "completed"
    table = "SELECT * EXCLUDE (config_hash) FROM trajectories ORDER BY ALL"
    assert ragen_core.query(table, tmp_path).to_pylist() == ragen_core.query(table, root).to_pylist()


def test_an_early_stop_drops_the_batches_sampled_ahead(tmp_path, tiny_model_dir):
    config = _config(tiny_model_dir, 2, iterations=4)
    # groups of one have no reward spread: without zero-spread groups the filter keeps none, and one such
    # iteration stops the run before iteration 1, when batches 1 and 2 are already published
    config["rollout"]["group_size"] = 1
    config["actor"] = {"mini_batch_size": 2, "micro_batch_size": 2}
    config["algorithm"] = {"filter_include_zero": False, "filter_empty_stop_steps": 1}
    result = ragen_core.train(config, tmp_path, RUN)
    assert result.status == "completed"
    manifest = DataLake(tmp_path).read_manifest(RUN)
    assert manifest.early_stop["iteration"] == 1
    rows = ragen_core.query("SELECT DISTINCT split, iteration FROM trajectories ORDER BY ALL", tmp_path).to_pylist()
    assert [(r["split"], r["iteration"]) for r in rows] == [("train", 0), ("val", 0), ("val", 1)]
    assert DataLake(tmp_path).committed_iterations(RUN) == [0, 1]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"trainer": {"max_staleness": 1, "mi_diagnostic": True}}, "trainer.mi_diagnostic scores each batch"),
        (
            {"trainer": {"max_staleness": 1}, "algorithm": {"filter_metric": "entropy", "filter_entropy": "full"}},
            "use filter_entropy=sampled",
        ),
        ({"algorithm": {"off_policy_correction": "tis"}, "rollout": {"backend": "scripted"}}, "use none"),
    ],
)
def test_what_an_async_run_cannot_do_is_refused_before_it_starts(tmp_path, overrides, says):
    from ragen_core.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=says):
        ragen_core.train(overrides, tmp_path, RUN)
    assert not (tmp_path / "runs").exists()
