"""The long commands say what they are doing as they go (issue 40, section 4 item 3): a resume says where it goes on
before it trains, an evaluation names each env as it starts and ends, an offline re-training its selection, its
validations and its epochs. The lines reach the caller through :func:`flows.ui.watching` (the command line prints
them as they come, as it prints the iteration lines), in the order the work is done."""

from __future__ import annotations

import pytest

from flows.ui import watching
from ragen_core.storage import DataLake, query

RUN = "prog"


def _config(model_dir, iterations: int) -> dict:
    return {
        "model": {"path": str(model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": iterations},
        "eval": {"every": 1, "instances": 2},
    }


def _heard(call) -> tuple[object, list[tuple[str, object]]]:
    """The flow's result and what it told its caller, in order: ``("step", text)`` and ``("iteration", i)``."""
    events: list[tuple[str, object]] = []
    with watching(lambda i, _: events.append(("iteration", i)), None, lambda text: events.append(("step", text))):
        result = call()
    return result, events


@pytest.fixture(scope="module")
def root(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.train import train

    root = tmp_path_factory.mktemp("progress")
    train(_config(tiny_model_dir, 1), data_root=str(root), run_id=RUN)
    return root


def test_a_resume_says_where_it_goes_on_before_it_trains(root, tiny_model_dir):
    from flows.train import train

    assert DataLake(root).committed_iterations(RUN) == [0, 1]  # the premise: 1 update, then the final validation
    _, events = _heard(
        lambda: train(_config(tiny_model_dir, 2), data_root=str(root), run_id=RUN, force_config=["trainer.iterations"])
    )
    # extended from its final validation (iteration 1), from the checkpoint its one update left, nothing to replay
    expected = f"resuming {RUN} at iteration 1 (extending it to 2 iterations): loading its checkpoint after 1 updates"
    assert events == [("step", expected), ("iteration", 1), ("iteration", 2)]


def test_an_evaluation_names_each_env_as_it_goes(root):
    from flows.evaluate import evaluate

    result, events = _heard(lambda: evaluate(f"{RUN}@2", n=2, data_root=str(root)))
    run_id = result["run_id"]
    (row,) = query(root, "SELECT success_rate FROM evaluations WHERE run_id = ?", params=[run_id]).to_pylist()
    texts = [value for kind, value in events if kind == "step"]
    assert texts[:2] == [f"evaluation run {run_id}: loading the policy {RUN}@2", "validating on bandit: 2 instances"]
    assert texts[2].startswith(f"bandit: success {row['success_rate']:.3f} (") and texts[2].endswith(" s)")
    assert events[-1] == ("iteration", 0) and len(texts) == 3  # every line before the result


def test_an_offline_retraining_says_each_of_its_steps(root, tiny_model_dir):
    from flows.retrain import retrain_offline

    sql = f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND split = 'train'"
    (count,) = query(root, sql.replace("*", "count(*) AS n", 1)).column("n").to_pylist()
    _, events = _heard(lambda: retrain_offline(_config(tiny_model_dir, 1), sql, f"run:{RUN}", "sft", str(root), "re"))
    texts = [value if kind == "step" else f"<iteration {value}>" for kind, value in events]
    assert [text for text in texts if not text.startswith("bandit: success")] == [
        f"{count} stored trajectories selected; loading the model run:{RUN}",
        "validating the model before training",
        "validating on bandit: 2 instances",
        f"epoch 1 of 1: sft over {count} trajectories",
        "<iteration 0>",
        "validating the re-trained model",
        "validating on bandit: 2 instances",
        "<iteration 1>",
    ]
    assert sum(text.startswith("bandit: success") for text in texts) == 2  # each validation's end, after its start
