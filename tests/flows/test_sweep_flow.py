"""The sweep flow as local subflows (no deployment), the evaluate flow, and their Prefect artifacts."""

from __future__ import annotations

import pytest

from ragen_core.storage import DataLake, query
from ragen_core.sweep import read_sweep

GRID = ["algorithm.filter_ratio=[0.5,1.0]"]


def _base(model_dir) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 1},
        "eval": {"every": 1, "instances": 3},
    }


@pytest.fixture(scope="module")
def swept(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.sweep import sweep

    root = tmp_path_factory.mktemp("sweep-lake")
    result = sweep(_base(tiny_model_dir), grid=GRID, data_root=str(root), sweep_id="local")
    return root, result


def _artifact(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_each_point_is_a_run_recording_its_sweep_and_overrides(swept):
    root, result = swept
    lake = DataLake(root)
    plan = read_sweep(lake, "local")
    assert [p.run_id for p in plan.points] == ["local-p000", "local-p001"]
    for point in plan.points:
        manifest = lake.read_manifest(point.run_id)
        assert manifest.status == "completed"
        assert manifest.sweep == {"id": "local", "point": point.index, "overrides": point.overrides}
        assert manifest.config["algorithm"]["filter_ratio"] == [0.5, 1.0][point.index]
    rows = query(
        root,
        """
        SELECT r.sweep_id, r.overrides_json, count(*) AS trajectories
        FROM trajectories t JOIN runs r USING (run_id) WHERE t.split = 'train' GROUP BY ALL ORDER BY ALL
    """,
    ).to_pylist()
    assert rows == [
        {"sweep_id": "local", "overrides_json": '["algorithm.filter_ratio=0.5"]', "trajectories": 4},
        {"sweep_id": "local", "overrides_json": '["algorithm.filter_ratio=1.0"]', "trajectories": 4},
    ]


def test_the_comparison_matches_the_lake(swept):
    root, result = swept
    assert [row["outcome"] for row in result["points"]] == ["COMPLETED", "COMPLETED"]
    for row in result["points"]:
        val = query(
            root,
            f"""
            SELECT iteration, avg(success::INT) AS success FROM trajectories
            WHERE run_id = '{row["run_id"]}' AND split = 'val' GROUP BY 1 ORDER BY 1
        """,
        ).to_pylist()
        reward = query(
            root,
            f"""
            SELECT avg(total_reward) AS r FROM trajectories
            WHERE run_id = '{row["run_id"]}' AND split = 'train' AND iteration = 0
        """,
        ).to_pylist()[0]["r"]
        assert [v["iteration"] for v in val] == [0, 1]
        assert row["val_success_first"] == pytest.approx(val[0]["success"])
        assert row["val_success"] == pytest.approx(val[1]["success"])
        assert row["final_reward"] == pytest.approx(reward)
        assert row["status"] == "completed" and row["iterations_done"] == 2


def test_artifacts_publish_each_iteration_and_the_comparison(swept):
    root, result = swept
    comparison = _artifact("ragen-local-comparison")
    assert len(comparison) == 1 and comparison[0].type == "table"
    assert "local-p001" in str(comparison[0].data)
    metrics = _artifact("ragen-local-p000-metrics")
    # one version per committed iteration (0: the update's iteration, 1: the final validation)
    assert sorted(a.description.rsplit(" ", 1)[1] for a in metrics) == ["0", "1"]
    final = next(a for a in metrics if a.description.endswith("iteration 1"))
    success = query(
        root, "SELECT value FROM metrics WHERE run_id = 'local-p000' AND iteration = 1 AND name = 'val/bandit/success'"
    ).to_pylist()[0]["value"]
    assert f"| validation success (bandit) | {success:.4g} |" in final.data


def test_running_the_sweep_again_skips_completed_points(swept, tiny_model_dir):
    from flows.sweep import sweep

    root, _ = swept
    lake = DataLake(root)
    before = {p: lake.read_manifest(p).updated_at for p in ("local-p000", "local-p001")}
    files = sorted(str(p) for p in (root / "trajectories").rglob("*.parquet"))
    again = sweep(_base(tiny_model_dir), grid=GRID, data_root=str(root), sweep_id="local", points=[1])
    assert [row["outcome"] for row in again["points"]] == ["not run", "COMPLETED"]
    assert {p: lake.read_manifest(p).updated_at for p in before} == before
    assert sorted(str(p) for p in (root / "trajectories").rglob("*.parquet")) == files


def test_evaluate_a_run_and_a_model_folder(swept, tiny_model_dir):
    from flows.evaluate import evaluate

    root, _ = swept
    lake = DataLake(root)
    result = evaluate("local-p000", n=5, data_root=str(root))
    assert result["model"] == "local-p000@1" and not result["reused"]
    run_id = result["run_id"]
    manifest = lake.read_manifest(run_id)
    assert manifest.kind == "evaluation" and manifest.status == "completed"
    assert manifest.evaluated["model_dir"].endswith("iteration=1/hf")
    assert manifest.config["eval"]["instances"] == 5
    assert manifest.config["rollout"]["max_new_tokens"] == 6  # the source run's config is the base
    val = query(root, f"SELECT avg(success::INT) AS s, count(*) AS n FROM trajectories WHERE run_id = '{run_id}'")
    expected = val.to_pylist()[0]
    assert expected["n"] == 5
    assert result["evaluations"][0]["success_rate"] == pytest.approx(expected["s"])
    assert evaluate("local-p000", n=5, data_root=str(root))["reused"]  # the same evaluation: the stored result

    folder = evaluate(str(tiny_model_dir), envs=["bandit"], n=2, data_root=str(root))
    assert folder["evaluations"][0]["instances"] == 2
    assert lake.read_manifest(folder["run_id"]).evaluated["model_dir"] == str(tiny_model_dir)


def test_evaluate_refuses_unknown_targets_and_envs(swept):
    from ragen_core.run.evaluation import EvaluationError, evaluation_config, resolve_target

    lake = DataLake(swept[0])
    with pytest.raises(EvaluationError, match="no checkpoint after 7 updates"):
        resolve_target("local-p000@7", lake)
    with pytest.raises(EvaluationError, match="neither a run id"):
        resolve_target("nope", lake)
    with pytest.raises(EvaluationError, match="no run 'nope'"):
        resolve_target("run:nope", lake)
    with pytest.raises(EvaluationError, match="unknown env"):
        evaluation_config(None, ["bandit", "chess"], 4)
