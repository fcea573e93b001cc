import json

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.config import load_config
from ragen_core.envs import base as env_base
from ragen_core.envs import register_env
from ragen_core.envs.bandit import BanditEnv
from ragen_core.storage import DataLake, query

GROUPS, GROUP_SIZE, VAL = 2, 4, 4


def _config(model_dir, iterations=2):
    return {
        "model": {"path": str(model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": GROUPS, "group_size": GROUP_SIZE, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": iterations},
        "eval": {"every": 1, "instances": VAL},
    }


@pytest.fixture(scope="module")
def trained_root(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.train import train

    root = tmp_path_factory.mktemp("lake")
    result = train(_config(tiny_model_dir), data_root=str(root), run_id="flow-test")
    assert result["run_id"] == "flow-test"
    return root


def test_each_iteration_stores_exactly_groups_times_group_size_train_rows(trained_root):
    rows = query(
        trained_root,
        "SELECT iteration, split, count(*) AS n, count(DISTINCT group_id) AS g, "
        "sum(kept::int) AS kept FROM trajectories GROUP BY 1, 2 ORDER BY 1, 2",
    ).to_pylist()
    train_rows = [(r["iteration"], r["n"], r["g"], r["kept"]) for r in rows if r["split"] == "train"]
    # filter_ratio 0.25 of 2 groups keeps int(0.5) -> at least 1 group = 4 trajectories
    assert train_rows == [(0, 8, 2, 4), (1, 8, 2, 4)]
    val_rows = [(r["iteration"], r["n"]) for r in rows if r["split"] == "val"]
    assert val_rows == [(0, VAL), (1, VAL), (2, VAL)]  # before any update, after 1, after 2 (final)


def test_trajectory_keys_are_unique_and_rows_carry_the_contract(trained_root):
    (dupes,) = query(
        trained_root,
        "SELECT count(*) - count(DISTINCT (run_id, iteration, split, env, group_id, "
        "traj_index)) AS d FROM trajectories",
    ).to_pylist()
    assert dupes["d"] == 0
    row = query(trained_root, "SELECT * FROM trajectories WHERE split = 'train' LIMIT 1").to_pylist()[0]
    for column in (
        "run_id",
        "iteration",
        "split",
        "env",
        "group_id",
        "traj_index",
        "env_seed",
        "total_reward",
        "success",
        "kept",
        "input_ids",
        "loss_mask",
        "behavior_logprobs",
    ):
        assert row[column] is not None, column
    assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["behavior_logprobs"])
    turn = query(
        trained_root, "SELECT turn_index, observation, response, actions, valid, reward FROM turns LIMIT 1"
    ).to_pylist()[0]
    assert turn["observation"].startswith("You play a two-armed bandit")


def test_metrics_manifest_and_commits(trained_root):
    names = {r["name"] for r in query(trained_root, "SELECT DISTINCT name FROM metrics").to_pylist()}
    assert {"rollout/reward_mean", "filter/keep_rate", "actor/pg_loss", "val/bandit/success", "time/update"} <= names
    lake = DataLake(trained_root)
    assert lake.committed_iterations("flow-test") == [0, 1, 2]
    manifest = lake.read_manifest("flow-test")
    assert manifest.status == "completed" and manifest.config_hash
    assert not (trained_root / "_staging" / "flow-test").exists() or not any(
        (trained_root / "_staging").rglob("*.parquet")
    )


def test_time_step_is_the_wall_time_from_one_commit_to_the_next(trained_root):
    """None at the process's first commit; later ones at least the stages that ran one after the other since."""
    rows = query(trained_root, "SELECT iteration, name, value FROM metrics WHERE name LIKE 'time/%'").to_pylist()
    by_iteration: dict[int, dict[str, float]] = {}
    for row in rows:
        by_iteration.setdefault(row["iteration"], {})[row["name"]] = row["value"]
    assert "time/step" not in by_iteration[0]
    for iteration in (1, 2):
        timings = by_iteration[iteration]
        stages = sum(v for k, v in timings.items() if k not in ("time/step", "time/commit") and not k.endswith("_s"))
        assert timings["time/step"] >= stages > 0, (iteration, timings)


def test_cli_sql_formats(trained_root):
    runner = CliRunner()
    statement = "SELECT iteration, count(*) AS n FROM trajectories WHERE split = 'train' GROUP BY 1 ORDER BY 1"
    result = runner.invoke(app, ["sql", statement, "--data-root", str(trained_root), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [{"iteration": 0, "n": 8}, {"iteration": 1, "n": 8}]
    result = runner.invoke(app, ["sql", statement, "--data-root", str(trained_root), "--format", "csv"])
    assert result.output.splitlines()[0].replace('"', "") == "iteration,n"


def test_rerunning_a_completed_run_does_nothing_and_another_config_is_refused(trained_root, tiny_model_dir):
    from flows.train import train
    from ragen_core.run.decisions import ResumeError

    before = query(trained_root, "SELECT count(*) AS n FROM trajectories").to_pylist()
    result = train(_config(tiny_model_dir), data_root=str(trained_root), run_id="flow-test")
    assert result["completed"] is True
    assert query(trained_root, "SELECT count(*) AS n FROM trajectories").to_pylist() == before
    changed = _config(tiny_model_dir)
    changed["rollout"] = {**changed["rollout"], "temperature": 0.7}
    with pytest.raises(ResumeError, match="rollout.temperature.*--force-config"):
        train(changed, data_root=str(trained_root), run_id="flow-test")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.bogus=1", "rollout.bogus"),
        ("rollout.group_size=many", "rollout.group_size"),
        ("rollout.env_groups=-2", "rollout.env_groups"),
    ],
)
def test_bad_config_fails_at_once_and_writes_nothing(tmp_path, override, key):
    root = tmp_path / "root"
    result = CliRunner().invoke(app, ["train", "--config", "configs/bandit.yaml", "--data-root", str(root), override])
    assert result.exit_code == 2
    assert key in result.output
    assert not root.exists()


def test_demo_config_is_valid():
    config = load_config("configs/bandit.yaml")
    assert config.bootstrap.enabled and config.bootstrap.policy == "random"
    assert config.algorithm.preset == "starpo_s" and config.eval.instances == 256


@pytest.mark.process  # `ragen --help` and a `ragen` command, as installed
def test_the_installed_console_script_runs(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    result = subprocess.run(
        [script, "sql", "SELECT count(*) AS n FROM trajectories", "--data-root", str(tmp_path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"n": 0}]


@pytest.mark.slow
def test_ragen_train_end_to_end_on_prefects_local_server(tmp_path, tiny_model_dir):
    """The user's path: the console script starts Prefect's temporary server under the data root and trains."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    # a fresh user shell: no Prefect settings and no distributed variables left by DeepSpeed in this test process
    dropped = {
        "PREFECT_HOME",
        "PREFECT_API_URL",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    overrides = [
        f"model.path={tiny_model_dir}",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=1",
        "eval.instances=2",
        "env.val_envs=[bandit,bandit_test]",
        "bootstrap.enabled=false",
        "trainer.num_threads=1",
    ]
    result = subprocess.run(
        [
            script,
            "train",
            "--config",
            "configs/bandit.yaml",
            "--data-root",
            str(tmp_path),
            "--run-id",
            "cli",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "validation success" in result.stdout and "SQL summary" in result.stdout
    assert (tmp_path / "_prefect" / "cli").is_dir()
    rows = query(tmp_path, "SELECT split, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1").to_pylist()
    assert rows == [{"split": "train", "n": 4}, {"split": "val", "n": 8}]
    summary = result.stdout.split("SQL summary", 1)[1]
    rows = [line for line in summary.splitlines() if " val " in line]  # one row per validation env and iteration
    assert sorted(line.split("│")[3].strip() for line in rows) == ["bandit", "bandit", "bandit_test", "bandit_test"]
    # the untrained model rarely ends a reply within 6 tokens: the run warns of it, stores the event and says so
    cut = query(tmp_path, "SELECT avg(truncated::int) AS cut FROM trajectories WHERE split = 'train'").to_pylist()
    assert cut[0]["cut"] >= 0.2
    events = query(
        tmp_path, "SELECT iteration, kind, value, threshold FROM events WHERE metric = 'rollout/truncated_rate'"
    ).to_pylist()
    assert events == [{"iteration": 0, "kind": "early_warning", "value": cut[0]["cut"], "threshold": 0.2}]
    assert "cut at rollout.max_new_tokens=6 without ending (from the first iteration" in result.stderr
    assert "replies cut at the token limit (last validation): bandit " in result.stdout


class _Overpaying(BanditEnv):
    """Pays 1.0 for Dragon every time but declares rewards of at most 0.5: its batches break the reward contract."""

    def reward_bounds(self, max_actions):
        return 0.0, 0.5


@pytest.fixture
def overpaying_bandit(tiny_model_dir):
    # registered only for this test (after the tiny model's tokenizer was built from the real registry)
    register_env("overpaying_bandit")(
        lambda **kw: _Overpaying(**{"name": "overpaying_bandit", "high_prob": 1.0, **kw})
    )
    yield
    del env_base._REGISTRY["overpaying_bandit"]


def test_a_bad_batch_is_quarantined_and_nothing_is_trained(
    prefect_harness, tmp_path, tiny_model_dir, overpaying_bandit
):
    from flows.train import train
    from ragen_core.run.batches import BatchRejected

    config = _config(tiny_model_dir, iterations=2)
    config["env"] = {"name": "overpaying_bandit", "val_envs": ["bandit"]}
    config["rollout"] |= {"backend": "scripted", "scripted_policy": "expert"}
    with pytest.raises(BatchRejected, match="reward_in_bounds"):
        train(config, data_root=str(tmp_path), run_id="bad")
    report = json.loads(
        (tmp_path / "quarantine" / "run_id=bad" / "iteration=0" / "rollout" / "report.json").read_text()
    )
    assert "reward_in_bounds" in {f["check"] for f in report["failures"]}
    lake = DataLake(tmp_path)
    splits = query(tmp_path, "SELECT DISTINCT split FROM trajectories WHERE run_id = 'bad'").to_pylist()
    assert splits == [{"split": "val"}]  # the validation batch before it was fine; the training batch never published
    assert query(tmp_path, "SELECT count(*) AS n FROM metrics").to_pylist() == [{"n": 0}]  # no update, no commit
    assert lake.committed_iterations("bad") == []
    assert lake.read_manifest("bad").status == "failed"
