"""The dataset env through the train flow, from a JSONL and from a Parquet file of the arithmetic example's prompts,
with the scripted expert (the file's reference answers): every answer scores 1 by the example's reward function, and
the stored turns hold the rows' prompts; a malformed reward function is one line before anything is created."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from examples.arithmetic.make_prompts import prompt_rows, write_rows
from ragen_cli.main import app
from ragen_core.run.checks import load_run_config
from ragen_core.storage import query


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_the_dataset_env_trains_from_a_jsonl_or_parquet_file(prefect_harness, tmp_path, tiny_model_dir, suffix):
    from flows.train import train

    rows = prompt_rows(40, 9, seed=7)
    data_file = tmp_path / f"prompts{suffix}"
    write_rows(rows, data_file)
    config = load_run_config(
        "configs/dataset_arithmetic.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"env.options.data_file={data_file}",
            "rollout.backend=scripted",
            "rollout.scripted_policy=expert",
            "rollout.env_groups=2",
            "rollout.group_size=2",
            "algorithm.filter_ratio=1.0",
            "actor.mini_batch_size=4",
            "actor.micro_batch_size=4",
            "trainer.iterations=1",
            "eval.every=1",
            "eval.instances=3",
            "bootstrap.enabled=false",
            "trainer.num_threads=1",
        ],
    )
    train(config.to_dict(), data_root=str(tmp_path / "root"), run_id="ds")
    found = query(tmp_path / "root", "SELECT split, env, env_seed, total_reward, success, num_turns FROM trajectories")
    found = found.to_pylist()
    assert len(found) == 2 * 2 + 2 * 3  # train: 2 groups x 2; val: 3 instances before and after the update
    assert all(
        r["env"] == "dataset" and r["success"] and r["total_reward"] == 1.0 and r["num_turns"] == 1 for r in found
    )
    turns = query(
        tmp_path / "root",
        "SELECT t.observation, j.env_seed FROM turns t JOIN trajectories j USING "
        "(run_id, iteration, split, env, group_id, traj_index)",
    ).to_pylist()
    assert turns and all(f"State:\n{rows[r['env_seed'] % 40]['prompt']}\n" in r["observation"] for r in turns)


def test_a_malformed_reward_function_is_one_line_before_anything_is_created(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--config",
            "configs/dataset_arithmetic.yaml",
            "--data-root",
            str(tmp_path / "root"),
            "env.options.reward_fn=examples.arithmetic.reward",
        ],
    )
    assert result.exit_code == 2 and not (tmp_path / "root").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "env.options.reward_fn: 'examples.arithmetic.reward' is not an import path" in lines[0]
