"""A reduced Bandit run that must learn (CI does not run the full demo)."""

import pytest

from ragen_core.config import load_config
from ragen_core.storage import query

pytestmark = pytest.mark.slow

# 8 iterations, not the 12 this test ran before: the lift is already far past its bar (validation success after 8,
# seeds 0-5 of the config: 0.94-0.98 against the bar of 0.85, ~4.5 binomial SDs at 128 instances; seed 3 after 6
# iterations was 0.78, so 6 would not do)
ITERATIONS = 8


def test_starpo_s_lifts_bandit_validation_success(prefect_harness, tmp_path):
    from flows.train import train

    config = load_config(
        "configs/bandit.yaml",
        [
            f"trainer.iterations={ITERATIONS}",
            f"eval.every={ITERATIONS}",
            "eval.instances=128",
            "env.val_envs=[bandit]",
            "trainer.num_threads=1",  # the config's 2 threads spin against the suite's other processes on 2 cores
        ],
    )
    train(config.to_dict(), data_root=str(tmp_path), run_id="learn")
    rows = query(
        tmp_path,
        "SELECT iteration, avg(success::int) AS s FROM trajectories WHERE split = 'val' GROUP BY 1 ORDER BY 1",
    ).to_pylist()
    assert [r["iteration"] for r in rows] == [0, ITERATIONS]
    before, after = rows[0]["s"], rows[1]["s"]
    # After the random-arm bootstrap the policy picks the better arm about half the time (observed ~0.48);
    # StarPO-S must lift it to at least 0.85 (observed 0.94-0.98 at this length, seed 0: 0.97).
    assert 0.3 < before < 0.7
    assert after >= 0.85
    demos = query(
        tmp_path,
        "SELECT avg((answer = 'Dragon')::int) AS dragon, avg(valid::int) AS ok FROM turns "
        "WHERE run_id LIKE 'bootstrap-%'",
    ).to_pylist()[0]
    assert abs(demos["dragon"] - 0.5) < 0.05 and demos["ok"] >= 0.95
