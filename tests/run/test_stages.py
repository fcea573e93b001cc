"""The commit stage records Echo-Trap early warnings as events rows (and the run goes on)."""

from ragen_core.config import build_config
from ragen_core.run.iteration import IterationState
from ragen_core.run.record import RunRecord
from ragen_core.run.session import RunSession
from ragen_core.run.stages import commit_iteration
from ragen_core.storage import DataLake, query
from schemas.manifest import RunManifest


def test_commit_writes_early_warning_events(tmp_path, caplog):
    config = build_config(overrides=["monitor.warmup=2", "monitor.reward_std_drop=0.5"])
    lake = DataLake(tmp_path)
    # a session needs no policy to commit: the commit stage only touches the lake and the metric history
    record = RunRecord(lake, "watch", RunManifest(run_id="watch", status="running"))
    session = RunSession(config, lake, "watch", policy=None, updater=None, record=record)
    stds = [0.30, 0.40, 0.35, 0.15, 0.38]
    grads = [1.0, 1.1, 0.9, 1.0, 9.0]
    # training success slips (monitor.success_slip 0.05): 3-iteration trailing mean 0.6 at the std's peak (1) and at
    # iteration 1 (three before the spike), 0.533 at 3, 0.433 at 4
    success = [0.6, 0.6, 0.6, 0.4, 0.3]
    for iteration, (std, grad, rate) in enumerate(zip(stds, grads, success, strict=True)):
        metrics = {
            "rollout/in_group_reward_std": std,
            "actor/entropy": 1.0,
            "actor/grad_norm_max": grad,
            "rollout/success_rate": rate,
        }
        commit_iteration(session, iteration, IterationState(metrics))
    events = query(tmp_path, "SELECT iteration, kind, metric, value, threshold FROM events ORDER BY 1, 3").to_pylist()
    assert [(e["iteration"], e["kind"], e["metric"]) for e in events] == [
        (3, "early_warning", "rollout/in_group_reward_std"),  # 0.15 < 0.5 * 0.40
        (4, "early_warning", "actor/grad_norm_max"),  # 9.0 > 5 x median(1.0, 1.1, 0.9, 1.0) = 5.0
    ]
    assert events[0]["threshold"] == 0.2 and events[1]["threshold"] == 5.0
    assert "Echo Trap" in caplog.text
    committed = query(tmp_path, "SELECT count(DISTINCT iteration) AS n FROM metrics").to_pylist()[0]["n"]
    assert committed == 5  # warnings never stop the run
