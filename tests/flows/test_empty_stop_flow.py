"""The filter's early stop (``algorithm.filter_empty_stop_steps``, RAGEN-2's ``rollout_filter_empty_stop_steps``)
through the real ``train`` flow (in-process, a tiny config): one-member groups have no reward spread, so RAGEN-2's
top_p filter without zero-spread groups keeps nothing; after 2 such iterations training stops and the final
validation follows; a run that failed there resumes to the same end, and is then done.
"""

import pytest

from ragen_core.storage import DataLake
from tests.flows.test_turn_rows_flow import _metrics, _rows, _tree

EMPTY = {
    "model": {},
    "env": {"val_envs": ["bandit"]},
    "rollout": {"env_groups": 2, "group_size": 1, "max_new_tokens": 8},
    "algorithm": {"filter": "top_p", "filter_ratio": 0.9, "filter_include_zero": False, "filter_empty_stop_steps": 2},
    "actor": {"mini_batch_size": 2, "micro_batch_size": 2},
    "trainer": {"iterations": 6, "checkpoint_every": 10},
    "eval": {"every": 10, "instances": 2},
}


@pytest.fixture(scope="module")
def empty_runs(prefect_harness, tmp_path_factory, tiny_model_dir):
    """A run whose filter never keeps anything, and one failed in its final validation, then resumed."""
    import flows.train as flow
    from ragen_core.run import procedures

    root = tmp_path_factory.mktemp("empty_stop")
    flow.train(_tree(EMPTY, tiny_model_dir), data_root=str(root), run_id="whole")

    def failing(session, iteration, hooks, tell=None):
        raise RuntimeError("injected failure in the final validation")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(procedures, "final_evaluation", failing)
        with pytest.raises(RuntimeError, match="injected"):
            flow.train(_tree(EMPTY, tiny_model_dir), data_root=str(root), run_id="resumed")
    flow.train(_tree(EMPTY, tiny_model_dir), data_root=str(root), run_id="resumed")
    return root


def test_training_stops_after_the_set_number_of_empty_iterations(empty_runs):
    lake = DataLake(empty_runs)
    assert lake.committed_iterations("whole") == [0, 1, 2]  # two empty iterations, then the final validation
    manifest = lake.read_manifest("whole")
    assert manifest.status == "completed"
    assert manifest.early_stop == {"iteration": 2, "reason": "filter_empty_stop_steps", "steps": 2}
    assert lake.commit_payload("whole", 2)["updated"] is False
    assert [n for n, _ in lake.list_checkpoints("whole")] == [2]  # the last state before the stop is saved
    metrics = _metrics(empty_runs, "whole")
    assert all(metrics[(i, "filter/kept_groups")] == 0.0 and metrics[(i, "actor/skipped_update")] for i in (0, 1))
    assert any(name.startswith("val/") for i, name in metrics if i == 2)


def test_a_run_failed_after_its_early_stop_resumes_to_the_same_end_and_is_then_done(empty_runs, tiny_model_dir):
    from flows.train import train

    lake = DataLake(empty_runs)
    assert lake.committed_iterations("resumed") == [0, 1, 2]
    assert _metrics(empty_runs, "resumed") == _metrics(empty_runs, "whole")
    assert _rows(empty_runs, "resumed") == _rows(empty_runs, "whole")
    assert lake.read_manifest("resumed").early_stop["iteration"] == 2
    again = train(_tree(EMPTY, tiny_model_dir), data_root=str(empty_runs), run_id="resumed")
    assert again.get("completed") is True and lake.committed_iterations("resumed") == [0, 1, 2]
