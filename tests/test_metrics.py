import pyarrow as pa
import pytest

from ragen_core.metrics import collapse_warnings, think_diversity, throughput_metrics

MONITOR = {"warmup": 2, "reward_std_drop": 0.5, "entropy_drop": 0.5, "grad_norm_spike": 5.0}


def _series(stds, entropies, grad_norms):
    return [
        {"rollout/in_group_reward_std": s, "actor/entropy": e, "actor/grad_norm_max": g}
        for s, e, g in zip(stds, entropies, grad_norms, strict=True)
    ]


def _events(series):
    """Feed the series one iteration at a time, as the commit stage does; (iteration, metric) of each warning."""
    fired = []
    for i, current in enumerate(series):
        fired += [(i, w.metric) for w in collapse_warnings(series[:i], current, **MONITOR)]
    return fired


def test_steady_series_raises_no_warning():
    series = _series([0.40, 0.42, 0.38, 0.41, 0.39, 0.40], [2.0, 1.9, 2.1, 2.0, 1.95, 2.0], [1, 1.2, 0.9, 1.1, 1, 1])
    assert _events(series) == []


def test_falling_std_and_entropy_and_a_grad_spike_raise_warnings():
    # std peaks at 0.4; 0.19 < 0.5 * 0.4 at iteration 4. entropy peaks at 2.0; 0.9 < 1.0 at iteration 5.
    # grad norm median of [1, 1, 1, 1, 1] = 1; 6 > 5 at iteration 5.
    series = _series([0.30, 0.40, 0.35, 0.25, 0.19, 0.10], [2.0, 1.8, 1.6, 1.4, 1.2, 0.9], [1, 1, 1, 1, 1, 6])
    assert _events(series) == [
        (4, "rollout/in_group_reward_std"),
        (5, "rollout/in_group_reward_std"),
        (5, "actor/entropy"),
        (5, "actor/grad_norm_max"),
    ]
    warning = collapse_warnings(series[:4], series[4], **MONITOR)[0]
    assert warning.value == 0.19 and warning.threshold == pytest.approx(0.2) and "Echo Trap" in warning.message


def test_no_warning_during_warmup():
    series = _series([1.0, 0.1], [2.0, 0.1], [1.0, 100.0])
    assert _events(series) == []  # the drop happens at iteration 1, with only one earlier iteration


def test_think_diversity_by_hand():
    turns = pa.table(
        {
            "group_id": [0, 0, 0, 1, 1],
            "turn_index": [0, 0, 0, 0, 0],
            "think": ["go left now", "go left now", "go right", "a b c", "c b a"],
        }
    )
    metrics = think_diversity(turns)
    # group 0: 2 distinct of 3 texts; bigrams (go,left),(left,now) x2 + (go,right) -> 3 distinct of 5
    # group 1: 2 of 2; bigrams (a,b),(b,c),(c,b),(b,a) -> 4 of 4
    assert metrics["rollout/think_distinct_rate"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert metrics["rollout/think_distinct_bigrams"] == pytest.approx((3 / 5 + 1.0) / 2)


def test_throughput():
    metrics = {"rollout/response_length": 20.0, "rollout/trajectories": 10.0, "time/generate": 4.0}
    metrics |= {"actor/trained_tokens": 300.0, "time/update": 1.5}
    assert throughput_metrics(metrics) == {
        "time/generate_tokens_per_s": 50.0,
        "time/update_tokens_per_s": 200.0,
    }
