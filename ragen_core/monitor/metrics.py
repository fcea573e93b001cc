"""Iteration metrics computed from stored rows (namespaced keys, e.g. ``rollout/reward_mean``), and the Echo-Trap
early warnings computed from the metric history.

Collapse indicators (RAGEN, "Metrics and collapse indicators"): in-group reward std and token entropy fall before
the reward does, and gradient-norm spikes mark an irreversible collapse. :func:`collapse_warnings` checks the
latest iteration against the run's history; the run logs each warning, records it as an ``events`` row and goes on.
RAGEN-2's template collapse (reasoning that no longer depends on the input) is watched the same way through
``diag/reasoning_mi_per_token`` or ``diag/reasoning_mi`` (:func:`template_collapse_warning`; the estimate itself:
:mod:`ragen_core.monitor.diagnostics`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def rollout_metrics(trajectories: pa.Table, turns: pa.Table, prefix: str = "rollout") -> dict[str, float]:
    """Reward, success, in-group reward std, lengths and format/validity rates of one batch."""
    reward = trajectories["total_reward"].to_numpy()
    frame = trajectories.select(["group_id", "total_reward"]).to_pandas()
    group_std = frame.groupby("group_id")["total_reward"].std(ddof=1).fillna(0.0).to_numpy()
    metrics = {
        f"{prefix}/reward_mean": _mean(reward),
        f"{prefix}/reward_std": float(np.std(reward, ddof=1)) if len(reward) > 1 else 0.0,
        f"{prefix}/success_rate": _mean(trajectories["success"].to_numpy(zero_copy_only=False).astype(float)),
        f"{prefix}/in_group_reward_std": _mean(group_std),
        f"{prefix}/response_length": _mean(trajectories["response_length"].to_numpy()),
        f"{prefix}/actions_per_traj": _mean(trajectories["num_actions"].to_numpy()),
        f"{prefix}/truncated_rate": _mean(trajectories["truncated"].to_numpy(zero_copy_only=False).astype(float)),
        f"{prefix}/format_error_rate": 1.0 - _mean(turns["format_ok"].to_numpy(zero_copy_only=False).astype(float)),
        f"{prefix}/valid_action_rate": _mean(turns["valid"].to_numpy(zero_copy_only=False).astype(float)),
        f"{prefix}/trajectories": float(trajectories.num_rows),
        f"{prefix}/group_pass_rate": float(
            trajectories.select(["group_id", "success"]).to_pandas().groupby("group_id")["success"].any().mean()
        ),
    }
    metrics.update(think_diversity(turns, prefix))
    metrics.update(teacher_agreement(turns, prefix))
    metrics.update(perception(turns, prefix))
    metrics.update(tool_use(turns, prefix))
    return metrics


FAILURES = "tool_failures"  # prefix/tool_failures/<tool>: the calls of a tool that raised or ran past its time


def tool_use(turns: pa.Table, prefix: str) -> dict[str, float]:
    """A tool env's calls (the turns' ``tool_calls``): calls per turn (``prefix/tool_calls``), the share of calls
    with an error of any kind (``prefix/tool_error_rate``: the agent's malformed calls, the tools' failures, calls not
    run) and, per tool that failed (raised, or ran past ``env.tool_timeout_s``), how many calls did
    (``prefix/tool_failures/<tool>``); none for envs without tools, and no error rate for turns that called
    nothing (a share of no calls)."""
    if "tool_calls" not in turns.column_names:
        return {}
    per_turn = [calls for calls in turns["tool_calls"].to_pylist() if calls is not None]
    if not per_turn:
        return {}
    calls = [call for turn in per_turn for call in turn]
    metrics = {f"{prefix}/tool_calls": _mean(np.array([len(turn) for turn in per_turn], dtype=float))}
    if calls:  # a share of no calls is no number: left out, as the metrics of a diagnostic with nothing to measure
        errors = np.array([call["error"] is not None for call in calls], dtype=float)
        metrics[f"{prefix}/tool_error_rate"] = _mean(errors)
    for call in calls:
        if call["error"] in ("raised", "timeout"):
            key = f"{prefix}/{FAILURES}/{call['name']}"
            metrics[key] = metrics.get(key, 0.0) + 1.0
    return metrics


def tool_failure_events(metrics: dict[str, float]) -> list[tuple[str, float, str]]:
    """``(metric, calls, message)`` for each tool whose calls failed in the iteration's rollouts
    (``.../tool_failures/<tool>``, :func:`tool_use`): the run's ``tool_error`` events (one per tool and rollout kind;
    the agent was told each error and the run went on)."""
    events = []
    for key in sorted(k for k in metrics if f"/{FAILURES}/" in k):
        stem, tool = key.split(f"/{FAILURES}/")
        where = "training" if stem == "rollout" else f"validation ({stem})"
        message = (
            f"{metrics[key]:g} call(s) of the tool {tool} raised or ran past env.tool_timeout_s in the {where} "
            "rollouts (each agent was told its error); which and why: SELECT turn_index, c.arguments, c.result "
            f"FROM turns, unnest(tool_calls) AS u(c) WHERE c.name = '{_sql_text(tool)}' AND c.error IN ('raised', "
            "'timeout')"
        )
        events.append((key, metrics[key], message))
    return events


def _sql_text(text: str) -> str:
    """``text`` inside an SQL string literal (its quotes doubled): a tool's name is shown in a query, never run."""
    return text.replace("'", "''")


def perception(turns: pa.Table, prefix: str) -> dict[str, float]:
    """The share of turns whose thinking is exactly the env's description of the state it saw
    (``prefix/think_right``, over the turns of envs that describe their state); none for envs without one."""
    if "info" not in turns.column_names:
        return {}
    right = [float(info["think_right"]) for info in map(_info, turns["info"].to_pylist()) if "think_right" in info]
    return {f"{prefix}/think_right": _mean(np.array(right))} if right else {}


def _info(text: str | None) -> dict:
    return json.loads(text) if text else {}


def teacher_agreement(turns: pa.Table, prefix: str) -> dict[str, float]:
    """The policy's agreement with the env's teacher (``prefix/teacher_agreement``: the share of turns whose first
    action is one of the teacher's best moves, over the turns where the teacher prefers some moves) against chance
    (``prefix/teacher_chance``: the same share for uniformly random actions); none for envs without a teacher."""
    if "info" not in turns.column_names:
        return {}
    agree, chance = [], []
    for text in turns["info"].to_pylist():
        info = json.loads(text) if text else {}
        if "teacher_agree" in info:
            agree.append(float(info["teacher_agree"]))
            chance.append(float(info["teacher_chance"]))
    if not agree:
        return {}
    return {f"{prefix}/teacher_agreement": _mean(np.array(agree)), f"{prefix}/teacher_chance": _mean(np.array(chance))}


def _bigrams(text: str) -> list[tuple[str, str]]:
    words = text.split()
    return list(zip(words, words[1:], strict=False))


def think_diversity(turns: pa.Table, prefix: str = "rollout") -> dict[str, float]:
    """Response diversity within groups (an Echo-Trap signal): for each (group, turn index), the share of distinct
    think texts among the group's replies, and distinct word bigrams over all bigrams; averaged over groups."""
    frame = turns.select(["group_id", "turn_index", "think"]).to_pandas()
    if frame.empty:
        return {}
    distinct_texts, distinct_bigrams = [], []
    for _, group in frame.groupby(["group_id", "turn_index"]):
        thinks = [str(t) for t in group["think"]]
        distinct_texts.append(len(set(thinks)) / len(thinks))
        bigrams = [b for text in thinks for b in _bigrams(text)]
        if bigrams:
            distinct_bigrams.append(len(set(bigrams)) / len(bigrams))
    metrics = {f"{prefix}/think_distinct_rate": _mean(np.array(distinct_texts))}
    if distinct_bigrams:
        metrics[f"{prefix}/think_distinct_bigrams"] = _mean(np.array(distinct_bigrams))
    return metrics


def throughput_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Tokens per second of generation and of the update, from the stage timings and counts already collected."""
    derived = {}
    generated = metrics.get("rollout/response_length", 0.0) * metrics.get("rollout/trajectories", 0.0)
    if metrics.get("time/generate", 0.0) > 0 and generated > 0:
        derived["time/generate_tokens_per_s"] = generated / metrics["time/generate"]
    if metrics.get("time/update", 0.0) > 0 and metrics.get("actor/trained_tokens", 0.0) > 0:
        derived["time/update_tokens_per_s"] = metrics["actor/trained_tokens"] / metrics["time/update"]
    return derived


@dataclass(frozen=True)
class CollapseWarning:
    """One early warning: which metric, its value, the threshold it crossed, and why that matters."""

    metric: str
    value: float
    threshold: float
    message: str


def _history(history: list[dict[str, float]], key: str) -> list[float]:
    return [h[key] for h in history if key in h and np.isfinite(h[key])]


def collapse_warnings(
    history: list[dict[str, float]],
    current: dict[str, float],
    warmup: int,
    reward_std_drop: float,
    entropy_drop: float,
    grad_norm_spike: float,
    converged_success: float = 1.0,
    success_slip: float | None = None,
) -> list[CollapseWarning]:
    """Warnings for ``current`` given the earlier iterations' metrics (``history``, oldest first); each marks the
    start of an episode (see :func:`episode_starts`: a signal still past its threshold is not warned again).

    - in-group reward std (``rollout/in_group_reward_std``) or token entropy (``actor/entropy``) below
      ``(1 - drop) x`` their running peak over the history, unless the policy has converged
      (``rollout/success_rate >= converged_success``: low spread is then the policy settling, not collapsing);
    - the iteration's largest gradient norm (``actor/grad_norm_max``) above ``grad_norm_spike x`` the median of the
      history's.
    Nothing is checked until the history holds ``warmup`` iterations with the metric.

    With ``success_slip`` set, a signal is warned only while the policy is losing ground: training success (its
    trailing mean over :data:`SUCCESS_WINDOW` iterations) has fallen at least ``success_slip`` since the iteration of
    the signal's peak (a drop) or over the last :data:`SUCCESS_WINDOW` iterations (a gradient spike). A healthy run's
    spread also falls as it converges on success; this tells the two apart (docs/findings.md, early warnings).
    """

    def crossings(past: list[dict[str, float]], now: dict[str, float]) -> list[CollapseWarning]:
        fired = _crossings(past, now, warmup, reward_std_drop, entropy_drop, grad_norm_spike, converged_success)
        if success_slip is None:
            return fired
        return [gated for w in fired if (gated := _losing_ground(past, now, w, success_slip)) is not None]

    return episode_starts(crossings, history, current)


def episode_starts(
    check: Callable[[list[dict[str, float]], dict[str, float]], list[CollapseWarning]],
    history: list[dict[str, float]],
    current: dict[str, float],
) -> list[CollapseWarning]:
    """The warnings ``check`` gives for ``current`` whose metric it did not also warn about at the previous
    iteration: one event per episode of a signal past its threshold, not one per iteration of it. Recomputed from the
    history (no state), so a resumed run warns exactly as the uninterrupted one."""
    fired = check(history, current)
    if not fired or not history:
        return fired
    before = {w.metric for w in check(history[:-1], history[-1])}
    return [w for w in fired if w.metric not in before]


SUCCESS = "rollout/success_rate"
SUCCESS_WINDOW = 3  # iterations of the trailing mean of training success the slip is measured on


def _trailing_success(series: list[dict[str, float]], position: int) -> float:
    """Mean training success over the :data:`SUCCESS_WINDOW` iterations ending at ``position`` (NaN: none has it)."""
    values = [h.get(SUCCESS, np.nan) for h in series[max(0, position - SUCCESS_WINDOW + 1) : position + 1]]
    return float(np.mean(values)) if values and all(np.isfinite(values)) else float("nan")


def _losing_ground(
    history: list[dict[str, float]], current: dict[str, float], warning: CollapseWarning, slip: float
) -> CollapseWarning | None:
    """``warning``, its message naming the slip, when training success has slipped by ``slip`` since the warned
    signal peaked (a drop) or over the last :data:`SUCCESS_WINDOW` iterations (a gradient spike); None otherwise
    (also when success is not recorded)."""
    series = [*history, current]
    now = len(history)
    if warning.metric == "actor/grad_norm_max":
        reference = max(0, now - SUCCESS_WINDOW)
    else:
        peaks = [(h[warning.metric], i) for i, h in enumerate(history) if np.isfinite(h.get(warning.metric, np.nan))]
        reference = max(peaks, key=lambda p: (p[0], -p[1]))[1]  # the first iteration at the peak
    before, after = _trailing_success(series, reference), _trailing_success(series, now)
    if not after <= before - slip:
        return None
    what, why = warning.message.split(": ", 1)
    slipped = f"{what}, while training success fell {before:.3g} -> {after:.3g} in {now - reference} iterations"
    return replace(warning, message=f"{slipped}: {why}")


def _crossings(
    history: list[dict[str, float]],
    current: dict[str, float],
    warmup: int,
    reward_std_drop: float,
    entropy_drop: float,
    grad_norm_spike: float,
    converged_success: float,
) -> list[CollapseWarning]:
    """Every threshold ``current`` is past (the checks of :func:`collapse_warnings`, episode or not)."""
    warnings = []
    converged = current.get("rollout/success_rate", float("nan")) >= converged_success
    for key, drop, what in (
        ("rollout/in_group_reward_std", reward_std_drop, "in-group reward std"),
        ("actor/entropy", entropy_drop, "token entropy"),
    ):
        past = _history(history, key)
        if converged or len(past) < max(warmup, 1) or key not in current:
            continue
        peak = max(past)
        threshold = (1.0 - drop) * peak
        if peak > 0 and current[key] < threshold:
            message = (
                f"{what} {current[key]:.4g} fell more than {drop:.0%} below its peak {peak:.4g}: "
                "an early sign of the Echo Trap (collapse into repeated templates)"
            )
            warnings.append(CollapseWarning(key, current[key], threshold, message))
    key = "actor/grad_norm_max"
    past = _history(history, key)
    if len(past) >= max(warmup, 1) and key in current:
        threshold = grad_norm_spike * float(np.median(past))
        if threshold > 0 and current[key] > threshold:
            message = (
                f"gradient norm {current[key]:.4g} is over {grad_norm_spike:g}x its running median: "
                "gradient spikes mark irreversible collapse"
            )
            warnings.append(CollapseWarning(key, current[key], threshold, message))
    return warnings


TRUNCATED = "rollout/truncated_rate"


def truncation_warnings(
    history: list[dict[str, float]], current: dict[str, float], share: float, max_new_tokens: int
) -> list[CollapseWarning]:
    """The share of training replies cut at ``max_new_tokens`` without a stop token (``rollout/truncated_rate``) at
    or above ``share``: once per episode (:func:`episode_starts`). A policy that stops ending its replies collapses
    silently (its answers may still score while every reply runs on to the limit: TRL logs
    ``completions/clipped_ratio`` for this reason); from the start, the limit is too small for the task."""

    def check(past: list[dict[str, float]], now: dict[str, float]) -> list[CollapseWarning]:
        value = now.get(TRUNCATED, float("nan"))
        if not value >= share:
            return []
        earlier = [(h[TRUNCATED], i) for i, h in enumerate(past) if np.isfinite(h.get(TRUNCATED, np.nan))]
        if earlier:
            low, at = min(earlier)
            since = f"up from {low:.2f} at iteration {at}: a policy that stops ending its replies collapses this way"
        else:
            since = "from the first iteration: rollout.max_new_tokens may be too small for the task"
        message = (
            f"{value:.0%} of the training replies were cut at rollout.max_new_tokens={max_new_tokens} without "
            f"ending ({since}; threshold monitor.truncated_share={share:g})"
        )
        return [CollapseWarning(TRUNCATED, value, share, message)]

    return episode_starts(check, history, current)


VALID = "rollout/valid_action_rate"


def unreached_warnings(history: list[dict[str, float]], current: dict[str, float], code: str) -> list[CollapseWarning]:
    """No training reply of the iteration gave a valid action (``rollout/valid_action_rate`` 0), so none reached
    ``code`` (the user's reward function, or the step of the user's environment): once per episode
    (:func:`episode_starts`). Such a run learns from format penalties alone and ends ``completed`` with success 0,
    which the user would otherwise read as their code scoring 0."""

    def check(past: list[dict[str, float]], now: dict[str, float]) -> list[CollapseWarning]:
        if now.get(VALID) != 0.0:
            return []
        message = (
            f"no training reply reached {code}: every reply failed the reply format or gave no answer "
            "(rollout/valid_action_rate 0); the policy learns from format penalties alone (a larger "
            "rollout.max_new_tokens, a bootstrap, or rollout.reply_format=lenient may help)"
        )
        return [CollapseWarning(VALID, 0.0, 0.0, message)]

    return episode_starts(check, history, current)


MI_KEY = "diag/reasoning_mi"  # the summed estimate (RAGEN-2's mi_seq_estimate)
# monitor.mi_metric -> the metric the template-collapse warning watches; per_token is RAGEN-2's collapse/mi_estimate
MI_KEYS = {"per_token": "diag/reasoning_mi_per_token", "sequence": MI_KEY}


def template_collapse_warning(
    history: list[dict[str, float]],
    current: dict[str, float],
    warmup: int,
    drop: float,
    patience: int,
    key: str = MI_KEY,
) -> CollapseWarning | None:
    """RAGEN-2's template collapse: the input-reasoning mutual information ``key`` (the run passes
    ``MI_KEYS[monitor.mi_metric]``, by default the per-token estimate, RAGEN-2's headline) has stayed more than
    ``drop`` below its running peak for ``patience`` consecutive iterations, this one included. Each of those values
    is compared with the peak of the values before it; the peak must be positive and come from at least ``warmup``
    earlier values (iterations without the metric are skipped)."""
    if key not in current or not np.isfinite(current[key]):
        return None
    values = _history(history, key) + [current[key]]
    if len(values) < patience:
        return None
    threshold = float("nan")
    for position in range(len(values) - patience, len(values)):
        past = values[:position]
        if len(past) < max(warmup, 1) or max(past) <= 0:
            return None
        threshold = (1.0 - drop) * max(past)
        if values[position] >= threshold:
            return None
    value = current[key]
    return CollapseWarning(
        key,
        value,
        threshold,
        f"input-reasoning mutual information {value:.4g} has stayed more than {drop:.0%} below its running peak "
        f"for {patience} iteration(s): a sign of template collapse (reasoning that no longer depends on the input)",
    )


def template_collapse_warnings(
    history: list[dict[str, float]],
    current: dict[str, float],
    warmup: int,
    drop: float,
    patience: int,
    key: str = MI_KEY,
) -> list[CollapseWarning]:
    """:func:`template_collapse_warning` (on ``key``) once per episode (:func:`episode_starts`): at the iteration the
    MI has first stayed low for ``patience`` iterations, not again until it recovers."""

    def check(past: list[dict[str, float]], now: dict[str, float]) -> list[CollapseWarning]:
        warning = template_collapse_warning(past, now, warmup, drop, patience, key)
        return [warning] if warning is not None else []

    return episode_starts(check, history, current)


def filter_metrics(trajectories: pa.Table) -> dict[str, float]:
    """Keep rate and the in-group std of kept vs dropped groups (after the filter set ``kept``)."""
    frame = trajectories.select(["group_id", "group_reward_std", "kept"]).to_pandas().drop_duplicates("group_id")
    kept = frame[frame["kept"]]
    dropped = frame[~frame["kept"]]
    metrics = {
        "filter/kept_groups": float(len(kept)),
        "filter/keep_rate": float(len(kept)) / max(len(frame), 1),
        "filter/kept_trajectories": float(pc.sum(pc.cast(trajectories["kept"], pa.int64())).as_py() or 0),
    }
    if len(kept):  # undefined when the filter keeps nothing (linear top_p below its target): left out, not NaN
        metrics["filter/kept_in_group_std"] = _mean(kept["group_reward_std"].to_numpy())
    if len(dropped):  # undefined when the filter keeps every group (ratio 1.0): left out rather than NaN
        metrics["filter/dropped_in_group_std"] = _mean(dropped["group_reward_std"].to_numpy())
    return metrics


def validation_metrics(trajectories: pa.Table, turns: pa.Table, env: str) -> dict[str, float]:
    """Success, pass@k (an instance counts when any of its k samples succeeds), reward, length, the format rate and
    the share of trajectories with a reply cut at the token limit for ``env``, the env's name in metric keys
    (:func:`ragen_core.envs.external.metric_env_name`), and the teacher agreement and the perception, for envs with a
    teacher or a description."""
    frame = trajectories.select(["group_id", "success", "total_reward", "response_length"]).to_pandas()
    pass_at_k = frame.groupby("group_id")["success"].any().mean() if len(frame) else float("nan")
    return {
        f"val/{env}/success": float(frame["success"].mean()),
        f"val/{env}/pass@k": float(pass_at_k),
        f"val/{env}/reward_mean": float(frame["total_reward"].mean()),
        f"val/{env}/response_length": float(frame["response_length"].mean()),
        f"val/{env}/format_ok_rate": _mean(turns["format_ok"].to_numpy(zero_copy_only=False).astype(float)),
        f"val/{env}/truncated_rate": _mean(trajectories["truncated"].to_numpy(zero_copy_only=False).astype(float)),
        **teacher_agreement(turns, f"val/{env}"),
        **perception(turns, f"val/{env}"),
        **tool_use(turns, f"val/{env}"),
    }
