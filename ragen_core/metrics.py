"""Iteration metrics computed from stored rows (namespaced keys, e.g. ``rollout/reward_mean``)."""

from __future__ import annotations

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
    }
    return metrics


def filter_metrics(trajectories: pa.Table) -> dict[str, float]:
    """Keep rate and the in-group std of kept vs dropped groups (after the filter set ``kept``)."""
    frame = trajectories.select(["group_id", "group_reward_std", "kept"]).to_pandas().drop_duplicates("group_id")
    kept = frame[frame["kept"]]
    dropped = frame[~frame["kept"]]
    metrics = {
        "filter/kept_groups": float(len(kept)),
        "filter/keep_rate": float(len(kept)) / max(len(frame), 1),
        "filter/kept_trajectories": float(pc.sum(pc.cast(trajectories["kept"], pa.int64())).as_py() or 0),
        "filter/kept_in_group_std": _mean(kept["group_reward_std"].to_numpy()),
    }
    if len(dropped):  # undefined when the filter keeps every group (ratio 1.0): left out rather than NaN
        metrics["filter/dropped_in_group_std"] = _mean(dropped["group_reward_std"].to_numpy())
    return metrics


def validation_metrics(trajectories: pa.Table, turns: pa.Table, env: str) -> dict[str, float]:
    """Success, pass@k (an instance counts when any of its k samples succeeds), reward and length for ``env``."""
    frame = trajectories.select(["group_id", "success", "total_reward", "response_length"]).to_pandas()
    pass_at_k = frame.groupby("group_id")["success"].any().mean() if len(frame) else float("nan")
    return {
        f"val/{env}/success": float(frame["success"].mean()),
        f"val/{env}/pass@k": float(pass_at_k),
        f"val/{env}/reward_mean": float(frame["total_reward"].mean()),
        f"val/{env}/response_length": float(frame["response_length"].mean()),
        f"val/{env}/format_ok_rate": _mean(turns["format_ok"].to_numpy(zero_copy_only=False).astype(float)),
    }
