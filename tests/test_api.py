"""The Python API (issue 40, section 2): ``import ragen_core`` trains, resumes, evaluates, re-trains, sweeps and
queries in this process without Prefect, returning result objects; a run it trains equals, row for row and weight
for weight, the same config trained by the ``train`` flow; a refused input is the project's own error, naming what
to fix."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import torch
from safetensors.torch import load_file

import ragen_core
from ragen_core.config import ConfigError
from ragen_core.run.decisions import ResumeError
from ragen_core.storage import DataLake, LakeError
from ragen_core.storage.layout import CHECKPOINT_HF

RUN = "api-run"
REPO_ROOT = Path(__file__).resolve().parents[1]


def _config(model_dir: Path, iterations: int = 2) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "env": {"name": "bandit", "val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
        "actor": {"mini_batch_size": 8, "micro_batch_size": 4},
        "trainer": {"iterations": iterations, "checkpoint_every": 1},
        "eval": {"every": 1, "instances": 2},
    }


def _rows(root: Path) -> dict[str, list[dict]]:
    """The run's stored rows that do not depend on the clock."""
    return {
        "trajectories": ragen_core.query("SELECT * FROM trajectories ORDER BY ALL", root).to_pylist(),
        "metrics": ragen_core.query(
            "SELECT iteration, name, value FROM metrics "
            "WHERE split_part(name, '/', 1) NOT IN ('time', 'perf') ORDER BY ALL",
            root,
        ).to_pylist(),
        "evaluations": ragen_core.query(
            "SELECT iteration, env, success_rate, reward_mean FROM evaluations ORDER BY ALL", root
        ).to_pylist(),
    }


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(next((checkpoint / CHECKPOINT_HF).glob("*.safetensors")))


@pytest.fixture(scope="module")
def api_root(tmp_path_factory, tiny_model_dir) -> tuple[Path, ragen_core.RunResult]:
    """A tiny run trained through the API: 2 iterations and the final validation."""
    root = tmp_path_factory.mktemp("api")
    seen: list[int] = []
    result = ragen_core.train(_config(tiny_model_dir), root, RUN, progress=lambda i, metrics: seen.append(i))
    assert seen == [0, 1, 2]  # each iteration, then the final validation
    return root, result


def test_the_api_returns_the_run_s_id_status_final_validation_and_paths(api_root):
    root, result = api_root
    assert (result.run_id, result.status) == (RUN, "completed")
    assert result.data_root == root.resolve() and result.run_dir == DataLake(root).run_dir(RUN)
    assert result.validation and all(name.startswith("val/") for name in result.validation)
    last = ragen_core.query(
        "SELECT name, value FROM metrics WHERE iteration = 2 AND name LIKE 'val/%'", root, run_id=RUN
    ).to_pylist()
    assert result.validation == {row["name"]: row["value"] for row in last}
    assert result.checkpoint is not None and result.checkpoint.parent.parent == result.run_dir


def test_the_api_trains_bitwise_the_run_the_train_flow_trains(api_root, prefect_harness, tmp_path, tiny_model_dir):
    from flows.train import train

    root, result = api_root
    flow = train(_config(tiny_model_dir), data_root=str(tmp_path), run_id=RUN)
    assert flow["run_id"] == RUN
    assert _rows(root) == _rows(tmp_path)
    assert len(_rows(root)["trajectories"]) == 2 * 8 + 3 * 2  # 2 x (2 groups x 4); validated at 0, 1, 2
    flow_checkpoint = DataLake(tmp_path).list_checkpoints(RUN)[-1][1]
    assert flow_checkpoint.name == result.checkpoint.name
    api_weights, flow_weights = _weights(result.checkpoint), _weights(flow_checkpoint)
    assert api_weights.keys() == flow_weights.keys() and api_weights
    assert all(torch.equal(api_weights[name], flow_weights[name]) for name in api_weights)


def test_a_completed_run_is_returned_as_it_is_and_resume_extends_it(api_root, tiny_model_dir):
    root, _ = api_root
    again = ragen_core.train(_config(tiny_model_dir), root, RUN)
    assert again.details["completed"] is True and again.status == "completed"
    with pytest.raises(ResumeError, match="trainer.iterations"):
        ragen_core.resume(RUN, root, overrides=["trainer.iterations=3"])  # a changed key must be allowed
    extended = ragen_core.resume(RUN, root, overrides=["trainer.iterations=3"], force_config=["trainer.iterations"])
    assert extended.details["resumed"]["extended_from"] == 2 and extended.status == "completed"
    assert DataLake(root).committed_iterations(RUN) == [0, 1, 2, 3]


def test_evaluate_stores_an_evaluation_run_and_returns_it_again(api_root):
    root, _ = api_root
    result = ragen_core.evaluate(RUN, root, n=2)
    assert result.run_id.startswith("evaluate-") and result.status == "completed" and not result.reused
    assert [(row["env"], row["instances"]) for row in result.evaluations] == [("bandit", 2)]
    assert result.validation  # its validation is its metrics
    again = ragen_core.evaluate(RUN, root, n=2)
    assert again.reused and again.run_id == result.run_id and again.evaluations == result.evaluations


def test_retrain_trains_on_the_selected_rows_as_a_new_run(api_root, tiny_model_dir):
    root, _ = api_root
    sql = f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND split = 'train' AND iteration = 0"
    result = ragen_core.retrain(
        _config(tiny_model_dir), sql, f"run:{RUN}", root, run_id="api-sft", overrides=["offline.epochs=1"]
    )
    assert (result.run_id, result.status, result.details["trajectories"]) == ("api-sft", "completed", 8)
    assert DataLake(root).committed_iterations("api-sft") == [0, 1]  # the epoch, then the validation after it
    assert DataLake(root).read_manifest("api-sft").kind == "offline"


def test_a_sweep_runs_each_point_and_compares_them(tmp_path, tiny_model_dir):
    result = ragen_core.run_sweep(
        _config(tiny_model_dir, iterations=1), tmp_path, grid=["seed=[1,2]"], sweep_id="api-sweep"
    )
    assert result.sweep_id == "api-sweep"
    assert [(row["run_id"], row["status"], row["outcome"]) for row in result.points] == [
        ("api-sweep-p000", "completed", "COMPLETED"),
        ("api-sweep-p001", "completed", "COMPLETED"),
    ]
    assert ragen_core.api.sweep is ragen_core.run_sweep
    manifest = DataLake(tmp_path).read_manifest("api-sweep-p001")
    assert manifest.sweep == {"id": "api-sweep", "point": 1, "overrides": ["seed=2"]}


def test_query_returns_arrow_pandas_or_a_duckdb_relation(api_root):
    root, _ = api_root
    sql = "SELECT iteration, count(*) AS n FROM trajectories WHERE split = 'train' AND iteration < 2 GROUP BY 1"
    sql += " ORDER BY 1"
    expected = [{"iteration": 0, "n": 8}, {"iteration": 1, "n": 8}]
    assert ragen_core.query(sql, root, run_id=RUN).to_pylist() == expected
    assert ragen_core.query(sql, root, run_id=RUN, form="pandas").to_dict("records") == expected
    relation = ragen_core.query(sql, root, run_id=RUN, form="duckdb")
    assert relation.fetchall() == [(0, 8), (1, 8)]


@pytest.mark.parametrize(
    ("sql", "kind", "says"),
    [
        ("SELECT * FROM nowhere", "CatalogException", "Table with name nowhere does not exist"),
        ("SELECT iteration FROM trajectories WHERE", "ParserException", 'near "WHERE" (at line 1, column 36)'),
        ("SELECT nope FROM metrics", "BinderException", 'Referenced column "nope" not found'),
    ],
)
def test_a_query_s_mistake_is_one_line_of_the_project_s_own_error(api_root, sql, kind, says):
    """Issue 51: the API's query errors came through as DuckDB's own classes with multi-line text."""
    from ragen_core.storage import QueryError

    with pytest.raises(QueryError) as failed:
        ragen_core.query(sql, api_root[0])
    assert failed.value.kind == kind and says in str(failed.value) and "\n" not in str(failed.value)
    assert isinstance(failed.value, LakeError) and failed.value.__cause__ is None


def test_a_query_has_a_time_limit_and_a_memory_limit(api_root):
    import time

    from ragen_core.storage import QueryError, QueryTimeout

    root = api_root[0]
    slow = "SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3"  # minutes of work
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match="time limit of 0.5 s"):
        ragen_core.query(slow, root, timeout=0.5)
    assert time.monotonic() - started < 10  # stopped, not waited for
    # a sort of 2e7 rows needs far more than 1MB of operator memory and may not spill
    with pytest.raises(QueryError, match="memory") as failed:
        ragen_core.query("SELECT * FROM range(20000000) ORDER BY random()", root, memory_limit="1MB")
    assert "OutOfMemory" in failed.value.kind
    for bad in ({"timeout": 0}, {"timeout": "soon"}, {"memory_limit": "4GB; SET x=1"}):
        with pytest.raises(QueryError, match="timeout must be|memory_limit must be"):
            ragen_core.query("SELECT 1", root, **bad)


def test_a_refused_input_is_the_project_s_own_error(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError) as refused:
        ragen_core.train({**_config(tiny_model_dir), "rollout": {"group_size": "many"}}, tmp_path)
    assert "rollout.group_size: Input should be a valid integer" in str(refused.value)
    assert not isinstance(refused.value, pydantic.ValidationError) and "Traceback" not in str(refused.value)
    with pytest.raises(LakeError, match="run id"):
        ragen_core.train(_config(tiny_model_dir), tmp_path, run_id="../elsewhere")
    with pytest.raises(ValueError, match="no run 'absent'"):
        ragen_core.resume("absent", tmp_path)
    with pytest.raises(LakeError, match="run id"):  # a name, never a pattern or a path
        ragen_core.plot("../*", tmp_path / "out.png", tmp_path)
    with pytest.raises(LakeError, match="unknown run 'absent'"):
        ragen_core.export("absent", tmp_path / "ds", tmp_path)
    with pytest.raises(ValueError, match="form must be one of arrow, pandas, duckdb"):
        ragen_core.runs(tmp_path, form="xml")
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_the_readme_walk_runs_through_the_api_alone(tmp_path, tiny_model_dir):
    """The README's walk after the demo (config show, train, runs, sql, plot, export, resume to extend, eval on two
    envs, retrain from the run, sweep), every step a function of ``ragen_core``: no command and no Prefect (no
    temporary server's home is made under the data root)."""
    import datasets
    import yaml

    root, config = tmp_path / "data", _config(tiny_model_dir, iterations=1)
    keys = {key.key: key for key in ragen_core.describe_config(REPO_ROOT / "configs/bandit.yaml")}
    written = yaml.safe_load((REPO_ROOT / "configs/bandit.yaml").read_text())
    assert keys["trainer.iterations"].value == written["trainer"]["iterations"]
    assert keys["trainer.iterations"].description and keys["seed"].default == 0
    with pytest.raises(LakeError, match="does not exist"):  # a read creates nothing
        ragen_core.runs(root)
    assert not root.exists()

    run = ragen_core.train(config, root, "walk")
    assert [(r["run_id"], r["kind"], r["status"], r["iterations"]) for r in ragen_core.runs(root).to_pylist()] == [
        ("walk", "train", "completed", 2)  # the iteration and the final validation
    ]

    sql = "SELECT iteration, env, avg(success::int) AS success FROM trajectories WHERE split = 'val' GROUP BY ALL"
    curve = ragen_core.query(sql + " ORDER BY ALL", root, form="pandas")
    rows = ragen_core.query("SELECT iteration, env, success FROM trajectories WHERE split = 'val'", root).to_pylist()
    by_hand: dict[tuple, list[bool]] = {}
    for row in rows:
        by_hand.setdefault((row["iteration"], row["env"]), []).append(row["success"])
    assert [(r["iteration"], r["env"], r["success"]) for r in curve.to_dict("records")] == [
        (*key, sum(seen) / len(seen)) for key, seen in sorted(by_hand.items())
    ]

    picture = ragen_core.plot("walk", tmp_path / "walk.png", root)
    assert picture.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.data

    report = ragen_core.export(["walk"], tmp_path / "ds", root)
    loaded = datasets.load_dataset("parquet", data_dir=str(tmp_path / "ds"))
    counts = ragen_core.query("SELECT split, count(*) AS n FROM trajectories GROUP BY ALL", root).to_pylist()
    stored = {("validation" if r["split"] == "val" else r["split"]): r["n"] for r in counts}
    assert {split: loaded[split].num_rows for split in loaded} == stored == report.rows["trajectories"]
    assert "system" in (tmp_path / "ds" / "README.md").read_text()  # the chat a client sends

    longer = ragen_core.resume("walk", root, overrides=["trainer.iterations=2"], force_config=["trainer.iterations"])
    assert longer.details["resumed"]["extended_from"] == 1 and DataLake(root).committed_iterations("walk") == [0, 1, 2]

    evaluation = ragen_core.evaluate("walk", root, envs=["bandit", "bandit_test"], n=4)
    assert [(row["env"], row["instances"]) for row in evaluation.evaluations] == [("bandit", 4), ("bandit_test", 4)]

    picked = "SELECT * FROM trajectories WHERE run_id = 'walk' AND split = 'train' AND iteration = 0"
    best = ragen_core.retrain(config, picked, f"run:{run.run_id}", root, run_id="best", overrides=["offline.epochs=1"])
    assert (best.status, best.details["trajectories"]) == ("completed", 8)

    sweep = ragen_core.run_sweep(config, root, grid=["algorithm.filter_ratio=[0.25,1.0]"], sweep_id="walk-sweep")
    assert [(row["run_id"], row["outcome"]) for row in sweep.points] == [
        ("walk-sweep-p000", "COMPLETED"),
        ("walk-sweep-p001", "COMPLETED"),
    ]
    listed = {row["run_id"]: row["kind"] for row in ragen_core.runs(root).to_pylist()}
    assert listed == {
        "walk": "train",
        evaluation.run_id: "evaluation",
        "best": "offline",
        "walk-sweep-p000": "train",
        "walk-sweep-p001": "train",
    }
    assert not (root / "_prefect").exists()
