import pyarrow as pa
import pytest

from ragen_core.monitor.metrics import (
    TRUNCATED,
    VALID,
    collapse_warnings,
    think_diversity,
    throughput_metrics,
    truncation_warnings,
    unreached_warnings,
)
from ragen_core.monitor.reports import iteration_line

MONITOR = {"warmup": 2, "reward_std_drop": 0.5, "entropy_drop": 0.5, "grad_norm_spike": 5.0}


def _series(stds, entropies, grad_norms):
    return [
        {"rollout/in_group_reward_std": s, "actor/entropy": e, "actor/grad_norm_max": g}
        for s, e, g in zip(stds, entropies, grad_norms, strict=True)
    ]


def _events(series, **monitor):
    """Feed the series one iteration at a time, as the commit stage does; (iteration, metric) of each warning."""
    fired = []
    for i, current in enumerate(series):
        fired += [(i, w.metric) for w in collapse_warnings(series[:i], current, **{**MONITOR, **monitor})]
    return fired


def test_steady_series_raises_no_warning():
    series = _series([0.40, 0.42, 0.38, 0.41, 0.39, 0.40], [2.0, 1.9, 2.1, 2.0, 1.95, 2.0], [1, 1.2, 0.9, 1.1, 1, 1])
    assert _events(series) == []


def test_falling_std_and_entropy_and_a_grad_spike_raise_warnings():
    # std peaks at 0.4; 0.19 < 0.5 * 0.4 at iteration 4. entropy peaks at 2.0; 0.9 < 1.0 at iteration 5.
    # grad norm median of [1, 1, 1, 1, 1] = 1; 6 > 5 at iteration 5.
    series = _series([0.30, 0.40, 0.35, 0.25, 0.19, 0.10], [2.0, 1.8, 1.6, 1.4, 1.2, 0.9], [1, 1, 1, 1, 1, 6])
    assert _events(series) == [
        (4, "rollout/in_group_reward_std"),  # iteration 5 is still below: the same episode, no second event
        (5, "actor/entropy"),
        (5, "actor/grad_norm_max"),
    ]
    warning = collapse_warnings(series[:4], series[4], **MONITOR)[0]
    assert warning.value == 0.19 and warning.threshold == pytest.approx(0.2) and "Echo Trap" in warning.message


def test_a_signal_that_recovers_and_falls_again_is_a_second_episode():
    # peak 0.4; below 0.2 at 2 and 3 (one episode), back at 0.3 at 4, below again at 5 (peak still 0.4)
    series = _series([0.40, 0.38, 0.10, 0.12, 0.30, 0.15], [2.0] * 6, [1.0] * 6)
    assert _events(series) == [(2, "rollout/in_group_reward_std"), (5, "rollout/in_group_reward_std")]


def test_a_converged_policy_is_quiet_while_a_collapsing_one_warns():
    """Success 1.0 with the spread gone is convergence; the same fall at success 0.3 is the Echo Trap."""
    stds, entropies = [0.5, 0.5, 0.4, 0.05, 0.0, 0.0], [2.0, 1.9, 1.5, 0.6, 0.4, 0.3]
    collapse = [(3, "rollout/in_group_reward_std"), (3, "actor/entropy")]
    for success, expected in ((1.0, []), (0.95, []), (0.3, collapse)):
        series = _series(stds, entropies, [1.0] * 6)
        for row in series[3:]:
            row["rollout/success_rate"] = success
        assert _events(series, converged_success=0.9) == expected, success
    # success reached only later: the drop that began while the policy still failed was warned at its start
    series = _series(stds, entropies, [1.0] * 6)
    for row, success in zip(series, [0.2, 0.3, 0.3, 0.4, 1.0, 1.0], strict=True):
        row["rollout/success_rate"] = success
    assert _events(series, converged_success=0.9) == [(3, "rollout/in_group_reward_std"), (3, "actor/entropy")]


def test_the_template_collapse_warning_fires_once_per_episode():
    from ragen_core.monitor.metrics import template_collapse_warnings

    mis = [1.0, 1.1, 0.5, 0.4, 0.3, 1.0, 0.2, 0.2]  # low (< 0.55) from 2 to 4, back at 5, low again from 6
    series = [{"diag/reasoning_mi": v} for v in mis]
    fired = [i for i in range(len(series)) if template_collapse_warnings(series[:i], series[i], 1, 0.5, 2)]
    assert fired == [3, 7]  # patience 2: the second low iteration of each episode


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


def _with_success(series, success):
    return [{**h, "rollout/success_rate": s} for h, s in zip(series, success, strict=True)]


def test_a_spread_that_falls_while_success_rises_is_not_warned_with_a_slip():
    """A run converging on success: reward std falls 0.4 -> 0.1 (past the 50% drop at iteration 4) while training
    success climbs 0.3 -> 0.8 (below monitor.converged_success): the signals alone warn, the success slip does not."""
    series = _with_success(
        _series([0.3, 0.4, 0.35, 0.3, 0.15, 0.1], [2.0] * 6, [1.0] * 6), [0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    )
    assert _events(series, converged_success=0.9) == [(4, "rollout/in_group_reward_std")]
    assert _events(series, converged_success=0.9, success_slip=0.05) == []


def test_a_spread_that_falls_while_success_slips_is_warned():
    """Reward std peaks at 0.4 at iteration 1 and falls below 0.2 at iteration 4. Trailing 3-iteration success at
    the peak: mean(0.5, 0.5) = 0.5; at iteration 4: mean(0.5, 0.45, 0.35) = 0.4333 <= 0.5 - 0.05: warned."""
    stds, flat = [0.3, 0.4, 0.38, 0.3, 0.15, 0.1], [2.0] * 6
    slipping = _with_success(_series(stds, flat, [1.0] * 6), [0.5, 0.5, 0.5, 0.45, 0.35, 0.3])
    assert _events(slipping, success_slip=0.05) == [(4, "rollout/in_group_reward_std")]
    # success holding at 0.46: trailing means 0.4733 (iteration 4) and 0.46 (5), both above 0.45: not warned; with a
    # slip of 0.03 the line is 0.47: iteration 5 is past it
    holding = _with_success(_series(stds, flat, [1.0] * 6), [0.5, 0.5, 0.5, 0.46, 0.46, 0.46])
    assert _events(holding, success_slip=0.05) == []
    assert _events(holding, success_slip=0.03) == [(5, "rollout/in_group_reward_std")]


def test_a_gradient_spike_is_warned_only_when_success_fell_over_the_last_iterations():
    """Gradient norm 6 > 5 x median(1, ...) at iteration 5. Success over the last 3 iterations: trailing mean at
    iteration 2 = mean(0.6, 0.6, 0.6) = 0.6, at 5 = mean(0.6, 0.5, 0.4) = 0.5 <= 0.55: warned; rising: not."""
    grads = [1.0, 1.0, 1.0, 1.0, 1.0, 6.0]
    falling = _with_success(_series([0.4] * 6, [2.0] * 6, grads), [0.6, 0.6, 0.6, 0.6, 0.5, 0.4])
    rising = _with_success(_series([0.4] * 6, [2.0] * 6, grads), [0.6, 0.6, 0.6, 0.6, 0.7, 0.8])
    assert _events(falling, success_slip=0.05) == [(5, "actor/grad_norm_max")]
    assert _events(rising, success_slip=0.05) == [] and _events(rising) == [(5, "actor/grad_norm_max")]


def test_without_a_recorded_success_a_slip_gated_signal_is_not_warned():
    series = _series([0.3, 0.4, 0.35, 0.3, 0.15, 0.1], [2.0] * 6, [1.0] * 6)
    assert _events(series, success_slip=0.05) == [] and _events(series) == [(4, "rollout/in_group_reward_std")]


def test_a_slip_gated_warning_names_the_slip():
    series = _with_success(
        _series([0.3, 0.4, 0.38, 0.3, 0.15, 0.1], [2.0] * 6, [1.0] * 6), [0.5, 0.5, 0.5, 0.45, 0.35, 0.3]
    )
    warning = collapse_warnings(series[:4], series[4], **MONITOR, success_slip=0.05)[0]
    assert warning.message == (
        "in-group reward std 0.15 fell more than 50% below its peak 0.4, while training success fell 0.5 -> 0.433 "
        "in 3 iterations: an early sign of the Echo Trap (collapse into repeated templates)"
    )


# The demo's training batches before the strict reply format: the truncated share of iterations 17-25 (from its lake).
DEMO_TRUNCATED = [0.0, 0.008, 0.102, 0.359, 0.891, 1.0, 0.992, 0.984, 0.992]


def _truncation_events(series: list[float], share: float = 0.2) -> list[tuple[int, str]]:
    history: list[dict[str, float]] = []
    events = []
    for iteration, value in enumerate(series):
        current = {TRUNCATED: value}
        events += [(iteration, w.message) for w in truncation_warnings(history, current, share, 32)]
        history.append(current)
    return events


def test_a_rising_truncated_share_is_warned_once_with_its_numbers():
    events = _truncation_events(DEMO_TRUNCATED)
    assert [iteration for iteration, _ in events] == [3]  # 0.359 >= 0.2, then the same episode: not again
    message = events[0][1]
    assert message.startswith("36% of the training replies were cut at rollout.max_new_tokens=32 without ending")
    assert "up from 0.00 at iteration 0" in message and "stops ending its replies" in message
    assert [i for i, _ in _truncation_events(DEMO_TRUNCATED, share=0.1)] == [2]  # a lower threshold: one earlier


def test_a_truncated_share_that_recovers_and_climbs_again_is_a_second_episode():
    assert [i for i, _ in _truncation_events([0.0, 0.3, 0.02, 0.0, 0.5])] == [1, 4]


def test_a_high_share_from_the_start_names_the_token_limit():
    (event,) = _truncation_events([0.6, 0.7])
    assert event[0] == 0 and "max_new_tokens may be too small" in event[1]


def test_a_low_or_missing_truncated_share_is_quiet():
    assert _truncation_events([0.0, 0.05, 0.133, 0.199, 0.0]) == []  # a healthy strict-format run's peak: 0.133
    assert truncation_warnings([], {"rollout/success_rate": 1.0}, 0.1, 32) == []


def test_the_iteration_line_shows_the_truncated_share():
    line = iteration_line(21, {"rollout/success_rate": 0.945, TRUNCATED: 0.891, "val/bandit/success": 1.0})
    assert line == "iter  21 · success 0.945 · trunc 0.891 · bandit/success 1.000"


def test_no_reply_reaching_the_users_code_is_warned_once_per_stretch():
    history = [{VALID: 0.5}, {VALID: 0.0}]  # iteration 1 already had none: the stretch began there
    assert unreached_warnings(history[:1], {VALID: 0.0}, "the reward function m:f")[0].message.startswith(
        "no training reply reached the reward function m:f: every reply failed the reply format"
    )
    assert unreached_warnings(history, {VALID: 0.0}, "the reward function m:f") == []
    assert unreached_warnings(history, {VALID: 0.25}, "x") == [] and unreached_warnings([], {}, "x") == []
    again = unreached_warnings([*history, {VALID: 0.25}], {VALID: 0.0}, "the step of environment m:Env")
    assert [w.metric for w in again] == [VALID]  # a second stretch: warned again


def test_the_users_code_a_run_reaches_is_named_for_the_warning(tmp_path, monkeypatch):
    from ragen_core.run.checks import build_run_config, load_run_config
    from ragen_core.run.stages import users_code
    from tests.envs.user_code import unique, write_env_module

    assert users_code(build_run_config(overrides=["env.name=bandit"])) is None
    dataset = load_run_config("configs/dataset_arithmetic.yaml")
    assert users_code(dataset) == "the reward function examples.arithmetic.reward:score"
    monkeypatch.syspath_prepend(str(tmp_path))
    env = write_env_module(tmp_path, unique("user_envs"))
    assert users_code(build_run_config(overrides=[f"env.name={env}"])) == f"the step of environment {env}"
