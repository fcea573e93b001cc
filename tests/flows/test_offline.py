"""Offline re-training from stored rollouts: pg reproduces the online update, scripted rows are refused by pg,
SQL may span runs (lineage names them), and a foreign tokenizer is refused."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.run.offline import OfflineError
from ragen_core.storage import DataLake
from schemas.tables import TRAJECTORY_KEY

BASE = {
    "env": {"val_envs": ["bandit"]},
    "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8, "temperature": 1.0},
    "algorithm": {"preset": "starpo_s", "adv_estimator": "grpo", "filter_ratio": 1.0},
    "actor": {"mini_batch_size": 8, "micro_batch_size": 8},
    "trainer": {"iterations": 1, "checkpoint_every": 1},
    "eval": {"every": 1, "instances": 2},
}


def _tree(model_dir, **sections):
    tree = {**BASE, "model": {"path": str(model_dir)}}
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values}
    return tree


@pytest.fixture(scope="module")
def lake_root(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.train import train

    root = tmp_path_factory.mktemp("offline")
    train(_tree(tiny_model_dir), data_root=str(root), run_id="src")
    train(_tree(tiny_model_dir, rollout={"backend": "scripted", "scripted_policy": "expert"}), str(root), "demo")
    return root


def _weights(root, run_id, updates):
    return load_file(root / "runs" / run_id / "checkpoints" / f"iteration={updates}" / "hf" / "model.safetensors")


def test_pg_on_the_stored_batch_reproduces_the_online_update(lake_root, tiny_model_dir):
    from flows.retrain import retrain_offline

    sql = "SELECT * FROM trajectories WHERE run_id = 'src' AND iteration = 0 AND split = 'train' AND kept"
    result = retrain_offline(_tree(tiny_model_dir), sql, str(tiny_model_dir), "pg", str(lake_root), "pg-replay")
    assert result["trajectories"] == 8
    online, offline = _weights(lake_root, "src", 1), _weights(lake_root, "pg-replay", 1)
    initial = load_file(tiny_model_dir / "model.safetensors")
    moved = 0
    for name, expected in online.items():
        diff = (offline[name] - expected).norm() / expected.norm().clamp(min=1e-12)
        assert float(diff) <= 1e-6, (name, float(diff))
        moved += int(not torch.equal(expected, initial[name]))
    assert moved > 0  # the update really changed the weights


def test_pg_refuses_scripted_rows(lake_root, tiny_model_dir):
    from flows.retrain import retrain_offline

    sql = "SELECT * FROM trajectories WHERE run_id = 'demo' AND split = 'train'"
    with pytest.raises(OfflineError, match="scripted.*--mode sft"):
        retrain_offline(_tree(tiny_model_dir), sql, str(tiny_model_dir), "pg", str(lake_root), "pg-scripted")


def test_sft_across_two_runs_records_both_in_its_lineage(lake_root, tiny_model_dir):
    from flows.retrain import retrain_offline

    sql = "SELECT * FROM trajectories WHERE run_id IN ('src', 'demo') AND split = 'train' AND iteration = 0"
    checkpoint = lake_root / "runs" / "src" / "checkpoints" / "iteration=1"  # start from a checkpoint (its hf export)
    result = retrain_offline(_tree(tiny_model_dir), sql, str(checkpoint), "sft", str(lake_root), "sft-both")
    assert result["trajectories"] == 16
    manifest = DataLake(lake_root).read_manifest("sft-both")
    assert manifest.kind == "offline" and manifest.status == "completed"
    assert manifest.lineage["source_runs"] == ["demo", "src"] and manifest.lineage["query"] == sql
    assert manifest.lineage["init"].endswith("iteration=1/hf")
    assert DataLake(lake_root).committed_iterations("sft-both") == [0, 1]
    _assert_runs_table_lineage(lake_root, sql, checkpoint)


def _assert_runs_table_lineage(lake_root, sql, checkpoint):
    """The ``runs`` table shows the real retrain's lineage (nulls for a normal run), and docs/sql.md's query
    "which runs were trained from run X" finds it from each of its two sources."""
    from pathlib import Path

    from ragen_core.storage import query
    from ragen_core.storage.sqldoc import named_queries

    lineage = "offline_mode, source_query, source_runs, source_iterations, source_trajectories, init_model, init_run, "
    rows = query(
        lake_root,
        f"SELECT run_id, {lineage} init_iteration FROM runs WHERE run_id IN ('src', 'sft-both') ORDER BY run_id",
    ).to_pylist()
    iterations = [{"run_id": "demo", "iterations": [0]}, {"run_id": "src", "iterations": [0]}]
    assert rows[0] == {
        "run_id": "sft-both",
        "offline_mode": "sft",
        "source_query": sql,
        "source_runs": ["demo", "src"],
        "source_iterations": iterations,
        "source_trajectories": 16,
        "init_model": str(checkpoint.resolve() / "hf"),
        "init_run": "src",
        "init_iteration": 1,
    }
    assert rows[1]["run_id"] == "src" and all(value is None for key, value in rows[1].items() if key != "run_id")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "sql.md").read_text()
    trained_from = named_queries(doc)["runs_trained_from"].replace("'sweep-a'", "$run_id")
    for source, from_checkpoint in (("src", True), ("demo", False)):
        found = query(lake_root, trained_from, params={"run_id": source}).to_pylist()
        assert {
            "run_id": "sft-both",
            "offline_mode": "sft",
            "iterations_used": [0],
            "started_from_its_checkpoint": from_checkpoint,
            "init_iteration": 1,
        } in found


def test_a_foreign_tokenizer_is_refused(lake_root, tiny_model_dir):
    from flows.retrain import retrain_offline

    path = lake_root / "runs" / "demo" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "tokenizer_fingerprint": "0123456789abcdef"}))
    try:
        with pytest.raises(OfflineError, match="another tokenizer"):
            retrain_offline(
                _tree(tiny_model_dir),
                "SELECT * FROM trajectories WHERE run_id = 'demo'",
                str(tiny_model_dir),
                "sft",
                str(lake_root),
                "sft-foreign",
            )
    finally:
        path.write_text(json.dumps(manifest))
    assert DataLake(lake_root).read_manifest("sft-foreign") is None  # refused before any compute or write


TOP_QUARTER = (
    "SELECT * FROM trajectories WHERE run_id = 'src' AND split = 'train' "
    "QUALIFY total_reward >= quantile_cont(total_reward, 0.75) OVER ()"
)


def test_readme_example_best_quarter_from_the_run_start_model(lake_root, tiny_model_dir):
    import numpy as np

    from flows.retrain import retrain_offline
    from ragen_core.storage import query

    rewards = [
        r["total_reward"]
        for r in query(
            lake_root, "SELECT total_reward FROM trajectories WHERE run_id = 'src' AND split = 'train'"
        ).to_pylist()
    ]
    expected = sum(r >= np.quantile(rewards, 0.75) for r in rewards)
    result = retrain_offline(_tree(tiny_model_dir), TOP_QUARTER, "run:src", "sft", str(lake_root), "best25")
    assert result["trajectories"] == expected
    lineage = DataLake(lake_root).read_manifest("best25").lineage
    assert lineage["init"] == str(tiny_model_dir.resolve()) and lineage["source_runs"] == ["src"]


def _lake_state(root) -> tuple:
    """What a refused command must leave as it was: every folder name under the data root's top-level folders, and
    the rows of every table."""
    from ragen_core.storage import query

    folders = sorted(str(p.relative_to(root)) for p in root.glob("*/*"))
    tables = ("trajectories", "turns", "metrics", "evaluations", "checkpoints", "runs")
    # one query for all six counts: each query opens the lake's views anew (~0.15 s), six of them cost ~1 s a state
    counts = query(root, "SELECT " + ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in tables)).to_pylist()[0]
    return folders, counts


KEYS = "SELECT 'src' AS run_id, 99 AS iteration, 'train' AS split, 'bandit' AS env, 0 AS group_id, 0 AS traj_index"


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (KEYS, "1 of the 1 keys the selection query returned match no stored trajectory"),
        (KEYS.replace("'src'", "'no/such run'"), "match no stored trajectory"),
        ("UNION ALL", "1 of the "),
        ("SELECT * FROM trajectories WHERE false", "returned no trajectories"),
        ("SELECT nothing FROM trajectories", "the selection query failed"),
    ],
)
def test_a_refused_retrain_creates_nothing(lake_root, tiny_model_dir, sql, message):
    from typer.testing import CliRunner

    from ragen_cli.main import app

    if sql == "UNION ALL":  # every stored key of src plus one made up: one unmatched key is refused too
        sql = f"SELECT {', '.join(TRAJECTORY_KEY)} FROM trajectories WHERE run_id = 'src' UNION ALL {KEYS}"
    before = _lake_state(lake_root)
    result = CliRunner().invoke(
        app,
        [
            "retrain",
            "--from",
            sql,
            "--mode",
            "sft",
            "--init",
            str(tiny_model_dir),
            "--data-root",
            str(lake_root),
            "--run-id",
            "refused",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stderr.startswith("error:")
    assert message in " ".join(result.stderr.split())
    assert _lake_state(lake_root) == before
    assert not (lake_root / "_prefect" / "refused").exists() and not (lake_root / "runs" / "refused").exists()


def test_a_retrain_over_an_existing_run_or_with_a_foreign_tokenizer_creates_nothing(lake_root, tiny_model_dir):
    from typer.testing import CliRunner

    from ragen_cli.main import app

    def retrain(run_id: str):
        return CliRunner().invoke(
            app,
            [
                "retrain",
                "--from",
                "SELECT * FROM trajectories WHERE run_id = 'demo'",
                "--mode",
                "sft",
                "--init",
                str(tiny_model_dir),
                "--data-root",
                str(lake_root),
                "--run-id",
                run_id,
            ],
        )

    before = _lake_state(lake_root)
    result = retrain("src")
    assert result.exit_code == 2 and "already exists" in result.stderr
    path = lake_root / "runs" / "demo" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "tokenizer_fingerprint": "0123456789abcdef"}))
    try:
        result = retrain("foreign")
    finally:
        path.write_text(json.dumps(manifest))
    assert result.exit_code == 2 and "another tokenizer" in result.stderr
    assert _lake_state(lake_root) == before and not (lake_root / "_prefect" / "foreign").exists()


def test_the_cli_names_an_offline_run_s_phases(lake_root, tiny_model_dir, tmp_path):
    """`ragen retrain --mode sft` titles its summary by what ran (offline SFT), not "before RL -> after RL"."""
    import yaml
    from typer.testing import CliRunner

    from ragen_cli.main import app

    config = tmp_path / "offline.yaml"
    config.write_text(yaml.safe_dump(_tree(tiny_model_dir)))
    sql = "SELECT * FROM trajectories WHERE run_id = 'demo' AND split = 'train' AND iteration = 0"
    args = [
        "retrain",
        "--from",
        sql,
        "--mode",
        "sft",
        "--init",
        str(tiny_model_dir),
        "--config",
        str(config),
        "--data-root",
        str(lake_root),
        "--run-id",
        "sft-cli",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "validation success (before -> after offline SFT)" in result.stdout
    assert "after RL" not in result.stdout and "trained on 8 stored trajectories" in result.stdout
